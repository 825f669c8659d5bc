"""``python -m msprobe_lite``: the same as the ``msprobe-lite`` command."""
from msprobe_lite.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
