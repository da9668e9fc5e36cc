"""The main job of the README (``tools/demo.py``): data, evaluation, report and figures.

* :mod:`.data`: the data folder (the generated embedded set or your own, read-only) and its
  loaders for the frozen-backbone evaluations;
* :mod:`.evaluate`: k-NN, linear probe and Binary-AUC of a backbone (teacher or random init);
* :mod:`.report`: ``report.md`` and ``summary.json``; :mod:`.figures`: the PNG figures.
"""
