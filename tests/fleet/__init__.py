"""Namespaced test hosts for fleets: see :mod:`tests.fleet.hosts`."""
