"""Tests against live GPUs (marked ``gpu``): run by hand on the accelerator machine."""
