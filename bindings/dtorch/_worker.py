"""The ``dtorch-worker`` command a pip install puts on PATH: runs the worker executable that ships
inside the package, with the same arguments (see ``dtorch-worker --help``)."""
import os
import sys


def main():
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dtorch-worker")
    os.execv(worker, [worker, *sys.argv[1:]])
