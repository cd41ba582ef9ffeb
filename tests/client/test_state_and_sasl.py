"""The state stores (atomic JSON file, memory) and the SCRAM client against the server's SCRAM."""

import json
import os

import pytest

from dcpflow.client import AuthenticationError, ClientState, JsonFileStore, MemoryStore, Offset, StateStoreError
from dcpflow.client.sasl import ScramClient
from dcpflow.client.state import StateStore
from dcpflow.server.auth import AuthFailed, ScramServer, UserDB, make_user


def state(**kw) -> ClientState:
    base = dict(bucket="default", bucket_uuid="u1", num_vbuckets=4,
                offsets={0: Offset(1 << 63, 5, 3, 9), 3: Offset.at(2, 7)}, purge_seqnos={3: 4})
    base.update(kw)
    return ClientState(**base)


def test_json_file_round_trip_and_format(tmp_path):
    store = JsonFileStore(tmp_path / "sub" / "offsets.json")
    assert store.load() is None
    store.save(state())
    loaded = store.load()
    assert loaded == state()
    doc = json.loads((tmp_path / "sub" / "offsets.json").read_text())
    # the compact form of the Spark source's offsets: the snapshot only when it is more than the seqno
    assert doc["format"] == 1 and doc["offsets"]["0"] == [1 << 63, 5, 3, 9] and doc["offsets"]["3"] == [2, 7]
    assert isinstance(store, StateStore) and isinstance(MemoryStore(), StateStore)


def test_files_in_the_earlier_object_form_keep_working(tmp_path):
    """State files written before the compact form hold each offset as an object: they load as
    they are, and the next save writes the compact form."""
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({
        "format": 1, "bucket": "default", "bucket_uuid": "u1", "num_vbuckets": 4,
        "offsets": {"0": {"vbuuid": 1 << 63, "seqno": 5, "snapshot_start": 3, "snapshot_end": 9},
                    "3": {"vbuuid": 2, "seqno": 7, "snapshot_start": 7, "snapshot_end": 7}},
        "purge_seqnos": {"3": 4}}, indent=1))
    store = JsonFileStore(path)
    assert store.load() == state()
    store.save(store.load())
    assert json.loads(path.read_text())["offsets"] == {"0": [1 << 63, 5, 3, 9], "3": [2, 7]}
    assert store.load() == state()


def test_a_manifest_uid_is_saved_and_loaded(tmp_path):
    """Room for collections: an offset's manifest uid survives the file (fifth in the compact form)."""
    store = JsonFileStore(tmp_path / "offsets.json")
    saved = state(offsets={0: Offset(7, 5, 3, 9, manifest_uid=0x1A), 1: Offset.at(7, 2)._replace(manifest_uid=0)})
    store.save(saved)
    assert json.loads((tmp_path / "offsets.json").read_text())["offsets"] == {"0": [7, 5, 3, 9, 26],
                                                                               "1": [7, 2, 2, 2, 0]}
    assert store.load() == saved and store.load().offsets[1].manifest_uid == 0


def test_save_is_atomic_replace(tmp_path, monkeypatch):
    """A crash while writing leaves the previous file whole, and no temporary file behind."""
    path = tmp_path / "offsets.json"
    store = JsonFileStore(path)
    store.save(state())
    real_fsync = os.fsync

    def crash(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(StateStoreError, match="No space left"):
        store.save(state(offsets={0: Offset.at(9, 99)}))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert store.load() == state()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.json"]


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ('{"format": 2, "bucket": "b"}', "not a dcpflow offsets document"),
    ('{"format": 1, "bucket": "b", "offsets": {"0": {"vbuuid": 1, "seqno": 9, "snapshot_start": 10, '
     '"snapshot_end": 10}}}', "bad offset"),
    ('{"format": 1, "bucket": "b", "offsets": {"x": [0, 0, 0, 0]}}', "bad offset"),
    ('{"format": 1, "bucket": "b", "offsets": {"0": [1, 9, 10]}}', "bad offset: offsets: vbucket 0: expected"),
    ('{"format": 1, "bucket": "b", "offsets": {"0": [1, 9, 9, 9, -2]}}', "manifest_uid must be an unsigned"),
])
def test_bad_files_are_named(tmp_path, text, words):
    path = tmp_path / "o.json"
    path.write_text(text)
    with pytest.raises(StateStoreError, match=words) as e:
        JsonFileStore(path).load()
    assert "fix or remove" in str(e.value) or str(path) in str(e.value) or "offset" in str(e.value)


def test_offsets_of_another_bucket_are_refused():
    s = state()
    s.check_bucket("default", "u1")
    s.check_bucket("default", None)
    with pytest.raises(StateStoreError, match="bucket 'default', not 'other'"):
        s.check_bucket("other", "u1")
    with pytest.raises(StateStoreError, match="dropped and re-created"):
        s.check_bucket("default", "u2")


def test_memory_store_copies():
    store = MemoryStore()
    s = state()
    store.save(s)
    s.offsets[0] = Offset()
    assert store.load().offsets[0] == Offset(1 << 63, 5, 3, 9) and store.saves == 1


# -- SCRAM -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mech, algorithm", [("SCRAM-SHA512", "sha512"), ("SCRAM-SHA256", "sha256"),
                                             ("SCRAM-SHA1", "sha1")])
def test_scram_against_the_server(mech, algorithm):
    users = UserDB([make_user("a,b=c", password="pw", roles=["admin"])])
    client = ScramClient(mech, "a,b=c", "pw")
    server = ScramServer(users, algorithm)
    final = server.step(client.final(server.start(client.first())))
    client.verify(final)
    assert server.user.name == "a,b=c"


def test_scram_wrong_password_and_forged_server():
    users = UserDB([make_user("u", password="right", roles=["admin"])])
    client = ScramClient("SCRAM-SHA512", "u", "wrong")
    server = ScramServer(users, "sha512")
    with pytest.raises(AuthFailed):
        server.step(client.final(server.start(client.first())))
    # A server that does not know the password cannot produce the signature.
    client = ScramClient("SCRAM-SHA512", "u", "right")
    server = ScramServer(users, "sha512")
    server_first = server.start(client.first())
    client.final(server_first)
    with pytest.raises(AuthenticationError, match="does not verify"):
        client.verify(b"v=" + b"A" * 88)
    with pytest.raises(AuthenticationError, match="does not extend ours"):
        ScramClient("SCRAM-SHA512", "u", "right", nonce="abc").final(b"r=xyz,s=AAAA,i=4096")
    with pytest.raises(AuthenticationError, match="malformed"):
        ScramClient("SCRAM-SHA512", "u", "right").final(b"garbage")
