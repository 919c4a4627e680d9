"""The course library of "The attention mechanism, derived and checked".

Modules, in the order the book introduces them:

- :mod:`attention_course.pooling`: attention as a soft lookup (chapter 1);
- :mod:`attention_course.attention`: softmax and scaled dot-product attention (chapter 2);
- :mod:`attention_course.masks`: padding and causal masks, masked attention (chapter 3);
- :mod:`attention_course.device`: the one place where the device is chosen;
- :mod:`attention_course.checks`: the checks that exercise notebooks call;
- :mod:`attention_course.grading`: the course's grader and the release tooling.

Importing the package does no work: no device probing, no downloads.
"""

__version__ = "0.1.0"
