"""Images read in place: an image folder listed as torchvision's ``ImageFolder`` lists it, a file list of
``path label`` lines or CSV, the listings held as arrays and cached, and a step's files read in one call.

- :mod:`.table`: :class:`~.table.FileTable`, a listing as arrays (paths in one blob, labels, sizes).
- :mod:`.listing`: an image folder, listed by torchvision's rules, in parallel, cached.
- :mod:`.filelist`: a file list (``path label`` lines, or CSV), parsed with errors naming file and line.
- :mod:`.cache`: where listings are kept and when a kept one is stale.
- :mod:`.read`: a step's files read by path into one buffer, the GIL released.
"""
