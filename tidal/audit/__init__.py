"""Checking committed work after the fact: ``verify`` re-hashes a step's files and checks its ids and
signature (``tidal verify``); ``ancestry`` walks a checkpoint back through the committed steps to its
source archives and licences (``tidal lineage``); ``catalog`` lists what a run committed; ``models``
exports and samples a trained model."""
