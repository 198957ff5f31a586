"""Graph breaks: where capture stops a graph, and how the frame goes on in Python.

- :mod:`~kiln.capture.breaks.reasons`: every break kind with its explanation and hint, and the
  :class:`~kiln.capture.errors.Unsupported` errors built from them (the vocabulary every
  evaluator module raises with).
- :mod:`~kiln.capture.breaks.rollback`: :class:`~kiln.capture.breaks.rollback.BreakTracer`, the
  frame's root tracer, which snapshots its state before each instruction so a break rolls back
  to the instruction that failed.
- :mod:`~kiln.capture.breaks.frame`: the values the new code reads back from the partial graph
  and the continuations it calls.
- :mod:`~kiln.capture.breaks.split`: the new code of a split frame.
- :mod:`~kiln.capture.breaks.resume`: ``resume_at_<offset>`` continuation functions.

Nothing is imported here: ``reasons`` sits below every other capture module, the rest above the
evaluator.
"""
