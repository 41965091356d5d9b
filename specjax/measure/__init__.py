"""Measuring decoding on this machine, the library the tasks and experiments share: timed
passes of several modes interleaved (``timing``), sweeps of drafter variants against AR per
prompt category and batch size (``sweep``), and the facts of the machine every record carries
(``machine``)."""
