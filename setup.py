"""daifu's optional C extensions (everything else is in pyproject.toml).

Declared here rather than under ``[tool.setuptools.ext-modules]`` in
pyproject.toml, which setuptools still marks experimental and warns about
at every install.  Each is optional: without a C compiler the install goes
on, and daifu does the same work in Python (``python -m daifu --version``
says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    # the barrier's check of remembered routes
    Extension("daifu.engine._routes", ["daifu/engine/_routes.c"], optional=True),
    # the program's signal handlers held back while daifu's own code runs
    Extension("daifu.engine._csignals", ["daifu/engine/_csignals.c"], optional=True),
    # flat code's walk when it is armed (``_rewrite._flat``)
    Extension("daifu.cells._rewrite._cflat", ["daifu/cells/_rewrite/_cflat.c"], optional=True),
    # the program's main module run with no frame of runpy's or daifu's below it
    Extension("daifu.hooks._cmain", ["daifu/hooks/_cmain.c"], optional=True),
])
