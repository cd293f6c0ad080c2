"""The installed package holds every Python file of the source tree (the binding in bindings/dtorch,
the model layer in python/dtorch), at the place its folder says: a file that meson does not install
is an ImportError for users only, which the rest of the suite would not see if nothing imports it."""
import os

import dtorch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = [os.path.join(ROOT, "bindings", "dtorch"), os.path.join(ROOT, "python", "dtorch")]


def source_files():
    for top in SOURCES:
        for folder, _, files in os.walk(top):
            for name in files:
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), top)


def test_every_source_file_is_installed():
    installed = os.path.dirname(dtorch.__file__)
    files = sorted(source_files())
    assert "__init__.py" in files and os.path.join("models", "llama.py") in files
    missing = [f for f in files if not os.path.isfile(os.path.join(installed, f))]
    assert missing == []


def test_the_layers_have_their_folders():
    import dtorch.models, dtorch.nn, dtorch.parallel, dtorch.pipelines, dtorch.serving   # noqa: E401
    for module, folder in ((dtorch.nn, "nn"), (dtorch.parallel, "parallel"), (dtorch.models, "models"),
                           (dtorch.serving, "serving"), (dtorch.pipelines, "pipelines")):
        assert os.path.basename(os.path.dirname(module.__file__)) == folder
    assert dtorch.models.ContinuousBatcher is dtorch.serving.ContinuousBatcher
