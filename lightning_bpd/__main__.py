"""``python -m lightning_bpd`` and the ``lightning-bpd`` command (``[project.scripts]``): see
:mod:`lightning_bpd.commands.cli`."""

from __future__ import annotations

from lightning_bpd.commands import cli


def main(argv: list[str] | None = None) -> int:
    """Run a command (``sys.argv[1:]`` by default); 0 once it ran. A console script exits with what its function
    returns, and the CLI's ``main`` returns the LightningCLI of a fit, which is no exit status."""
    cli.main(argv)
    return 0


if __name__ == "__main__":
    main()
