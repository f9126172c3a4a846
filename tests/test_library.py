"""`import hypura` loads our llama.cpp with OpenMP's spin-wait shortened, unless the user chose one."""

import os
import subprocess
import sys

import pytest

SHOW_SPIN = "import os, hypura; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"


def spin_after_import(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", SHOW_SPIN], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_import_shortens_the_openmp_spin():
    assert spin_after_import() == "10000 None"


@pytest.mark.parametrize("env, expected", [({"GOMP_SPINCOUNT": "300000"}, "300000 None"),
                                           ({"OMP_WAIT_POLICY": "active"}, "None active")])
def test_a_users_openmp_wait_setting_is_kept(env, expected):
    assert spin_after_import(**env) == expected
