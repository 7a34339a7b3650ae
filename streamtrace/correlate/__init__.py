"""The correlate stage (spec blocking-analysis.md): which kernels block or
contend with NCCL collectives.

Three analyses, over GPU and CPU activity collected from the stream plus
align's matched collectives:

1. *Why was the late rank late?*  For every matched collective instance
   (send/recv excepted), the delay Δ of the last arriver L behind the first
   arriver R is split on L into host launch lateness, GPU dependency wait and
   GPU backlog (they add up to Δ);
   backlog is attributed to the compute kernels that ran in the window, by
   their excess over the same kernel on the other ranks, and host lateness to
   the CPU ops on the launching thread by self time.
2. *What ran alongside each collective?*  Per NCCL kernel, its overlap with
   compute kernels on other streams; contention pairs; NCCL and compute
   inflation under overlap; SM share and wave (tail-effect) risk.
3. *How much communication was exposed?*  Per rank (and profiler step): comm
   time hidden under compute vs exposed, split into waiting and transfer, and
   an HTA-style temporal breakdown.

All interval arithmetic runs in the C sweeps (``_native``) over numpy arrays;
Python loops run per collective instance or output row, never per kernel.
Times are integer ns on the aligned timeline; sheets show µs.

Modules, lowest first:

- ``constants``: the spec's numbers several analyses share.
- ``growing``: columns filled part by part (``_Growing``).
- ``columns``: each sheet's columns, and the sheets of a run with nothing to
  analyze, built without pandas (the analyses' modules load it).
- ``timeline``: one rank's ``Timeline``, and ``_classify`` (comm vs compute,
  the comm union, window lengths: what needs no other rank; compute
  union and buckets are made when used).
- ``compute``: ``_Compute``, every rank's compute kernels in one table.
- ``inputs``: align's collectives as an instance table; ``Inputs``, the
  timelines on the aligned clock.
- ``summary``: ``compact``, a rank's Timeline reduced to what the
  cross-rank analyses read (the blocking analysis' per-rank summary:
  picklable, a fraction of the rank's events), and the packed CPU ops.
- ``collect``: ``RankTimeline`` and ``StreamCollector``, a rank's frames
  kept as they stream past and finished into a Timeline at the rank's end.
- ``late_rank``: part 1 (collective_blockers, blocking_kernels,
  blocking_host_ops).
- ``overlap``: part 2, collective_overlap and contention_pairs.
- ``inflation``: part 2, nccl_inflation and compute_inflation.
- ``exposed``: part 3, exposed_comm.
- ``stage``: the stage (``correlate_frames``, ``analyze``) and the short
  answer (``blockers_text``).
"""
