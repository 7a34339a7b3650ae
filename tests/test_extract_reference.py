"""extract == the pure-Python reference, on every real trace and on fixtures."""
import pytest

from conftest import real_id, real_traces
from helpers import assert_matches_reference, extract_one
from reference import reference_extract


@pytest.mark.parametrize("path", real_traces(), ids=real_id)
def test_real_trace_matches_reference(path):
    data = assert_matches_reference(path)
    doc, _ = reference_extract(path)
    if isinstance(doc, dict):
        for key in ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceName"):
            if key in doc:
                assert data.meta["trace"][key] == _plain(doc[key]), key
        assert data.meta["layout"] == "object"
    else:
        assert data.meta["layout"] == "array"


def _plain(v):
    """Decimal -> float, recursively (metadata is parsed with plain json)."""
    import json

    return json.loads(json.dumps(v, default=float))


@pytest.mark.parametrize("path", real_traces()[:1] + [p for p in real_traces() if "tracelens" in p], ids=real_id)
def test_keep_pyfunc_matches_reference(path):
    assert_matches_reference(path, keep_pyfunc=True)


def test_pyfunc_skipped_and_counted(real_dir):
    path = f"{real_dir}/tracelens/resnet_act_checkpoint.json.gz"
    data = extract_one(path)
    assert data.meta["counts"]["pyfunc_skipped"] == 34405
    assert "python_function" not in set(data.events_df()["cat"])
