"""calibration.json: each measurement made once, older versions dropped."""

from __future__ import annotations

import json
from pathlib import Path

from runner.runtime.calibration_cache import CALIBRATION_FILE, CALIBRATION_VERSION, cached_json
from runner.speculation.cost_model import ShapeCosts


def test_calibration_is_measured_once_and_older_versions_are_dropped(tmp_path: Path) -> None:
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"v0:old-model": {"1": {"sizes": [1], "seconds": [9.0]}}}))
    made = []

    def make() -> dict:
        made.append(1)
        return {"1": {"sizes": [1, 2], "seconds": [0.01, 0.015]}}

    key = f"{CALIBRATION_VERSION}:model"
    first = cached_json(tmp_path, key, make)
    again = cached_json(tmp_path, key, make)
    assert made == [1] and again == first and ShapeCosts.from_json(again).micro_batch_s(1, 2) == 0.015
    assert list(json.loads((tmp_path / CALIBRATION_FILE).read_text())) == [key]
