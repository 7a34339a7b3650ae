"""The align stage: each rank's collectives collected (``collect``), matched
across ranks, with clock offsets and data-quality findings (``stage``)."""
