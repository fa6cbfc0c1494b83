"""``python -m lightning_bpd``: see :mod:`lightning_bpd.cli`."""

from lightning_bpd.cli import main

if __name__ == "__main__":
    main()
