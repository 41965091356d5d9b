"""Checkpoint layouts of other libraries: published drafters in, specjax drafters out."""
