import os
import sys

# `helpers` lives next to the tests; make it importable however pytest is invoked.
sys.path.insert(0, os.path.dirname(__file__))
