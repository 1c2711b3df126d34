"""Build the Cython core (C level, -O3)."""

from glob import glob

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "xg2._ext.core",
        ["xg2/_ext/core.pyx"],
        # The core is one extension whose parts (one job each) are included files.
        depends=sorted(glob("xg2/_ext/*.pxi")),
        include_dirs=[np.get_include()],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    ),
    # Logits masked on the CPU by the bitmask's words (plain C, no numpy).
    Extension(
        "xg2._ext.bitmask",
        ["xg2/_ext/bitmask.pyx"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
    # Rule automata (subset construction, minimisation, canonical numbering); plain C, no numpy.
    Extension(
        "xg2._ext.automata",
        ["xg2/_ext/automata.pyx"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
    # The numbered ring of bitmask rows that remote steps name instead of resending (plain C).
    Extension(
        "xg2._ext.rowbook",
        ["xg2/_ext/rowbook.pyx"],
        extra_compile_args=["-O3", "-fno-strict-aliasing"],
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        annotate=False,
    )
)
