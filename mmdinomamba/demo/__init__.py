"""The main job of the README (``tools/demo.py``): data, evaluation, report and figures.

* :mod:`.data`: the data folder (the generated embedded set or your own, read-only) and its
  loaders for the frozen-backbone evaluations;
* :mod:`.recipe`: the settings of the DINO recipe derived from measurements of the data;
* :mod:`.supervised`: the supervised baseline's config (same backbone, data, size, epochs);
* :mod:`.collapse`: a collapse of the teacher as a result (checkpoint and record, exit 3);
* :mod:`.evaluate`: k-NN, linear probe and Binary-AUC of a backbone (teacher, supervised or
  random init);
* :mod:`.report`: ``report.md`` and ``summary.json``; :mod:`.figures`: the PNG figures.
"""
