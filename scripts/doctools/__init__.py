"""What the documents' generators in scripts/ share, in one place instead of once per script.

- ``document``: a document's sections between ``<!-- PREFIX:NAME -->`` markers, rewritten in place.
- ``files``: files written atomically (a reader never sees half of one), JSON among them.
- ``markdown``: tables and GitHub's heading anchors.
- ``machine``: what a figure depends on besides the code (CPU, cores, memory, torch): the one
  description of a machine every generator writes beside its figures.
- ``samples``: the sample outputs of the documents (``$ COMMAND`` blocks) held against what
  their commands print (``tests/test_docs_commands.py``, ``scripts/doc_samples.py``).
- ``commands``: commands written as a user types them, run with this interpreter, their
  output streamed.
- ``torchrun``: the torchrun command built once, a run's JSON result read once.
- ``cluster_experiment``: the emulated cluster's measurements and tables
  (``scripts/cluster_results.py``).

Docs tooling, not a user feature, so it lives beside the scripts and not in the wheel. A
script run as ``python scripts/X.py`` finds it because Python puts the script's folder
first on ``sys.path``; the tests find it through pytest's ``pythonpath`` setting in
pyproject.toml. Nothing here edits ``sys.path``.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/ and docs/ are beside each other
DOCS = ROOT / "docs"
