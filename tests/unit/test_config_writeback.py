"""Writing admin changes back to config files: the records change, everything else stays."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.writeback import acl_key, destination_key, rewrite, rewrite_groups, user_key


def test_unchanged_lines_keep_their_comments_and_changed_ones_are_replaced(tmp_path):
    f = tmp_path / "queues.conf"
    f.write_text("# head\n\na maxmsgs=1   # keep me\nb maxmsgs=2 # old\n[j1, j2]c\n# tail\n")
    rewrite(f, {"a": "a maxmsgs=1", "b": "b maxmsgs=3", "d": "d"}, destination_key)
    assert f.read_text() == "# head\n\na maxmsgs=1   # keep me\nb maxmsgs=3\n# tail\nd\n"


def test_a_record_on_two_lines_keeps_the_first_place(tmp_path):
    f = tmp_path / "acl.conf"
    f.write_text("QUEUE=q USER=a PERM=send\n# x\nQUEUE=q USER=a PERM=receive\n")
    rewrite(f, {("queue", "q", "a", False): "QUEUE=q USER=a PERM=receive,send"}, acl_key)
    assert f.read_text() == "QUEUE=q USER=a PERM=receive,send\n# x\n"


def test_users_conf_passwords_may_hold_a_hash_sign(tmp_path):
    f = tmp_path / "users.conf"
    f.write_text('a:pw #1:"first"\nb:x:""\n')
    rewrite(f, {"a": 'a:pw #1:"first"'}, user_key, inline_comments=False)
    assert f.read_text() == 'a:pw #1:"first"\n'


def test_a_missing_file_is_created_and_nothing_is_left_beside_it(tmp_path):
    f = tmp_path / "topics.conf"
    rewrite(f, {"t": "t trace"}, destination_key)
    assert f.read_text() == "t trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topics.conf"]


def test_groups_are_edited_as_blocks(tmp_path):
    f = tmp_path / "groups.conf"
    f.write_text('# g\nops:"operators"\nalice\n# night shift\nbob\n\ndev:"developers"\ncarol\n')
    rewrite_groups(f, {"ops": ('ops:"operators"', ["bob", "dave"]),
                       "new": ('new:""', ["erin"])})
    assert f.read_text() == ('# g\nops:"operators"\n# night shift\nbob\ndave\n\n'
                             'new:""\nerin\n')


names = st.text(alphabet="abcxyz", min_size=1, max_size=4)


@settings(max_examples=60, derandomize=True, database=None)
@given(before=st.dictionaries(names, st.sampled_from(["", " maxmsgs=1", " secure"])),
       after=st.dictionaries(names, st.sampled_from(["", " maxmsgs=1", " secure"])))
def test_the_file_holds_exactly_the_records_afterwards(tmp_path_factory, before, after):
    f: Path = tmp_path_factory.mktemp("wb") / "queues.conf"
    f.write_text("# c\n" + "".join(f"{k}{v}\n" for k, v in before.items()))
    rewrite(f, {k: f"{k}{v}" for k, v in after.items()}, destination_key)
    lines = f.read_text().splitlines()
    assert lines[0] == "# c"
    assert sorted(lines[1:]) == sorted(f"{k}{v}" for k, v in after.items())
