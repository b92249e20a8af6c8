"""``python -m lptrain`` runs the ``lptrain`` command (handy under torchrun)."""

from lptrain.cli import main

main()
