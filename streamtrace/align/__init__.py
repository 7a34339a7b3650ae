"""The align stage: each rank's collective kernels, matched across ranks, with
clock offsets and data-quality findings.  Modules, lowest first:

``custom``     custom collective kernels: user patterns -> Collective name
``collect``    a rank's frames reduced, as they stream past, to the rows align
               keeps (RankCollector; no pandas)
``quality``    data-quality findings (the rows of ``align.quality``; no pandas)
``describe``   a rank's collective kernels selected and described
               (finish_rank, RankResult; numpy only)
``tables``     the ``align.*`` table names and columns; the tables of ranks without
               collectives built as numpy columns (no pandas: an empty run never loads it)
``sequences``  slots within one process group: by Seq, or by aligning each
               rank's sequence against a consensus (align_sequences)
``clocks``     per-rank clock offsets from collective ends (estimate_clock_offsets)
``match``      matching across ranks and the ``align.*`` tables (match_ranks)
``stage``      the stage over the stream (align_frames, align_tables), its
               options, reading its tables back; the public names
"""
