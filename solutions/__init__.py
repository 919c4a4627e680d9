"""Reference solutions: everything that holds answers, and nothing else.

Hidden tests of the exercise notebooks compare a learner's functions with these. Where a reference is
the same code as a library module (code that later chapters build on), it is re-exported from
``attention_course`` rather than written twice. Deleting this package leaves a course that a learner
can use in full; only grading needs it.
"""
