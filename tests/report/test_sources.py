"""Reading a campaign from a real (SQLite) MLflow store."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from k25exp.report.sources import ReportError, latest_campaign, load_campaign
from k25exp.runners.campaign_report import folder_name


def test_latest_campaign_is_the_newest_phase_runs_not_a_report(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(uri)
    with pytest.raises(ReportError, match="no run .* has a campaign tag"):
        c.create_experiment("k25exp/macro")
        latest_campaign(uri)
    exp = c.get_experiment_by_name("k25exp/macro").experiment_id
    for t, (campaign, phase) in enumerate([("B", "macro"), ("A", "macro"), ("B", "report")]):
        c.create_run(exp, start_time=1000 + t, tags={"campaign": campaign, "k25exp.experiment": phase})
    c.create_run(exp, start_time=2000, tags={"campaign": "B", "k25exp.experiment": "macro",
                                             "k25exp.role": "parent"})
    assert latest_campaign(uri) == "A"  # B's report and B's multirun parent came later
    loaded = load_campaign(uri, "B")
    assert [r.phase for r in loaded.runs] == ["macro"]  # the report and the parent are not phases
    with pytest.raises(ReportError, match="campaign 'C' has no phase runs"):
        load_campaign(uri, "C")


def test_campaign_ids_become_one_safe_folder():
    assert folder_name("campaign-20261129T120000Z") == "campaign-20261129T120000Z"
    assert folder_name("../../etc") == ".._.._etc" and "/" not in folder_name("a/b")
    assert folder_name("..") == "campaign___" and folder_name(".") == "campaign__"


def test_a_campaign_holds_the_runs_its_sections_read_beyond_its_phases(tmp_path):
    # spec_profile is no campaign phase (multirun.sh never runs it) but the report's
    # speculative section reads it: load_campaign dropped it, and the section never showed
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(uri)
    exp = c.create_experiment("k25exp/any")
    for t, phase in enumerate(["spec_decode", "spec_profile", "report"]):
        c.create_run(exp, start_time=1000 + t, tags={"campaign": "S", "k25exp.experiment": phase})
    loaded = load_campaign(uri, "S")
    assert sorted(r.phase for r in loaded.runs) == ["spec_decode", "spec_profile"]
    assert len(loaded.of("spec_profile", status=None)) == 1
    assert "spec_profile" not in loaded.missing_phases()  # it is read, never required
