"""The old top-level ``policies`` and ``training`` import paths alias ``memento.policies`` / ``memento.training``."""

from __future__ import annotations

import subprocess
import sys


def test_old_import_paths_are_the_same_modules_and_warn() -> None:
    code = ("import warnings\n"
            "warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import policies\nexcept DeprecationWarning as e:\n    print('warned', e)\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            "import policies, policies.linucb, training.config\n"
            "from policies.similarity import SimilarityPolicy\n"
            "import memento.policies.linucb, memento.policies.similarity, memento.training.config\n"
            "assert policies is memento.policies and policies.linucb is memento.policies.linucb\n"
            "assert training.config is memento.training.config\n"
            "assert SimilarityPolicy is memento.policies.similarity.SimilarityPolicy\n"
            "print('same')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "warned 'policies' is now 'memento.policies'" in result.stdout
    assert result.stdout.strip().endswith("same")
