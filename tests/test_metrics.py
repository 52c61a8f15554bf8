import pytest

from vkv.evals.metrics import contains_keyword, keyword_correct, kl_full_to_method, retention


@pytest.mark.parametrize(
    "text,keyword,expected",
    [
        ("It uses bcryptjs for hashing.", "bcryptjs", True),
        ("It uses bcryptjs for hashing.", "bcrypt", False),  # reject bcrypt must not fire on bcryptjs
        ("It uses bcrypt for hashing.", "bcryptjs", False),  # accept bcryptjs must not match bcrypt
        ("It uses BCRYPT.", "bcrypt", True),  # case-insensitive, sentence punctuation is not part of the token
        ("the secret is dev-secret", "secret", True),  # 'the secret' is a whole token
        ("JWT_SECRET defaults to dev-secret.", "secret", False),  # inside dev-secret and JWT_SECRET
        ("JWT_SECRET defaults to dev-secret.", "dev-secret", True),
        ("run with node:test", "node:test", True),
        ("run with node:test", "test", False),  # glued by ':' to node
        ("run with node:test", "node", False),
        ("status 'done'", "done", True),
        ("status done/failed", "done", False),
        ("(bcryptjs)", "bcryptjs", True),
        ("uses bcrypt.js", "bcrypt", False),
    ],
)
def test_whole_token_matching(text, keyword, expected):
    assert contains_keyword(text, keyword) is expected


def test_keyword_correct_needs_accept_and_no_reject():
    assert keyword_correct("bcryptjs", ["bcryptjs"], ["bcrypt"])
    assert not keyword_correct("bcryptjs, not bcrypt", ["bcryptjs"], ["bcrypt"])
    assert not keyword_correct("argon2", ["bcryptjs"], ["bcrypt"])


def test_retention_arithmetic():
    assert retention(-2.0, -10.0, -1.0) == pytest.approx(8 / 9)
    assert retention(-10.0, -10.0, -1.0) == 0.0
    assert retention(-0.5, -10.0, -1.0) > 1.0  # better than full is reported, not clipped
    assert retention(-12.0, -10.0, -1.0) < 0.0
    assert retention(-3.0, -1.0, -1.0) is None  # no evidence to keep


def test_kl_is_zero_for_identical_and_positive_otherwise():
    import torch

    p = torch.log_softmax(torch.randn(3, 11), -1)
    q = torch.log_softmax(torch.randn(3, 11), -1)
    assert kl_full_to_method(p, p) == pytest.approx(0.0, abs=1e-7)
    assert kl_full_to_method(p, q) > 0


def test_in_transcripts_a_keyword_may_be_a_whole_path_or_module_segment():
    assert contains_keyword("require github.com/rs/zerolog v1.33.0", "zerolog", in_paths=True)
    assert not contains_keyword("require github.com/rs/zerolog v1.33.0", "zerolog")  # in answers, / still joins
    assert contains_keyword("require github.com/rs/zerolog v1.33.0", "rs/zerolog", in_paths=True)
    assert contains_keyword("import hashicorp/hcl/v2", "hcl", in_paths=True)
    assert not contains_keyword("JWT_SECRET=dev-secret", "secret", in_paths=True)  # hyphenated names stay whole
    assert not contains_keyword("uses node:test", "test", in_paths=True)
    assert not contains_keyword("bcrypt.js", "bcrypt", in_paths=True)


def test_validate_names_the_form_a_keyword_hides_in():
    from vkv.evals.validate import check_static
    from vkv.text.transcript import parse_transcript

    data = {
        "id": "t",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "pip install argon2-cffi==23.1.0"},
        ],
        "questions": [{"id": "q", "question": "Which hasher?", "accept": ["argon2"], "source_turns": [1]}],
    }
    problems = check_static(parse_transcript(data)).problems
    assert len(problems) == 1 and "appears only inside 'argon2-cffi'" in problems[0]
    data["questions"][0]["accept"] = ["argon2", "argon2-cffi"]
    assert check_static(parse_transcript(data)).problems == []
    data["messages"][1]["content"] = "go get github.com/rs/zerolog"  # a path segment states it
    data["questions"][0]["accept"] = ["zerolog"]
    assert check_static(parse_transcript(data)).problems == []
