"""The machinery shared by several stages, defined once: the batch tree (:mod:`.batch`), and the rooms the stage
packages import instead of each other's private modules. The core never imports ``integrations``, ``report``,
``widgets`` or ``experiments`` (``tests/test_imports.py`` enforces it)."""
