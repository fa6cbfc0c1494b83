"""``python -m lightning_bpd``: see :mod:`lightning_bpd.commands.cli`."""

from lightning_bpd.commands.cli import main

if __name__ == "__main__":
    main()
