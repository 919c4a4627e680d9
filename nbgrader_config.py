"""nbgrader configuration of the course (https://nbgrader.readthedocs.io/en/stable/configuration/).

Layout: the source notebooks (with solutions and hidden tests) are in solutions/<id>/<id>.ipynb and
`nbgrader generate_assignment <id>` writes the student release to exercises/<id>/<id>.ipynb.
Submissions go to submitted/<student>/<id>/ as usual; the gradebook is gradebook.db (not in git).
"""

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.course_id = "attention-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# A learner who deletes a test cell by accident gets it back at grading time (the hidden tests with it)
# rather than losing its points: the course's grader (attention-grade) does the same.
c.OverwriteCells.add_missing_cells = True

# Each cell of a submission may run this many seconds (nbgrader's default; attention-grade uses it too).
c.Execute.timeout = 30

# Once a submission's cells have run, its kernel is stopped at once rather than asked to exit: nbclient's
# "graceful" shutdown waits about 1.3 s a notebook for the kernel's exit and its atexit hooks (a quarter of
# the time each notebook takes to grade), and a submission's atexit hooks have nothing to do at grading time.
c.Execute.shutdown_kernel = "immediate"
