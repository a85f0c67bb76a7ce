"""The backends: each makes one rank's batches of an epoch behind one interface (:mod:`.base`)."""
