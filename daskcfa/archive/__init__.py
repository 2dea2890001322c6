"""Archive operations: build, re-fragment, check and move CFA datasets.

The data-centre side of daskcfa. Each operation is a function of the public
API (re-exported from :mod:`daskcfa`) and a subcommand of the ``daskcfa``
command line (:mod:`daskcfa.cli`, a thin shell over these functions).
"""
