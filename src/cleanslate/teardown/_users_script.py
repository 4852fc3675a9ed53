"""Name the users of a host by uid.

A self-contained, stdlib-only script (shipped to a host's ``python3`` like
``_signal_script.py``), so that a teardown's report says whose processes it saw.

Input (argv[1], JSON): a list of uids. Output (stdout, JSON): ``{"names": {"<uid>": name or
null}}``, ``null`` for a uid the host's user database does not know.
"""

from __future__ import annotations

import json
import pwd
import sys


def main() -> int:
    names: dict[str, str | None] = {}
    for uid in json.loads(sys.argv[1]):
        try:
            names[str(uid)] = pwd.getpwuid(int(uid)).pw_name
        except (KeyError, ValueError, OverflowError):
            names[str(uid)] = None
    print(json.dumps({"names": names}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
