"""Pure OCR scoring: quote extraction, normalisation, best-substring edit distance and the score formula."""
import pytest

from deepgen_rl.services.ocr.scoring import (
    best_substring_distance,
    extract_target_texts,
    normalize_text,
    ocr_score,
)


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ('a sign that says "OPEN"', ["OPEN"]),
        ("a sign that says “OPEN 24H” in neon", ["OPEN 24H"]),
        ('"first" then “second” then "third"', ["first", "second", "third"]),
        ('unbalanced "hello and more', []),
        ('"closed" then an unbalanced " quote', ["closed"]),
        ('mixed "straight” is not a pair', []),
        ("it's Bob's shop, no double quotes", []),
        ('empty "" and blank "   " are dropped, "kept" is not', ["kept"]),
        ("no quotes at all", []),
    ],
)
def test_extract_target_texts(prompt, expected):
    assert extract_target_texts(prompt) == expected


def test_normalize_text_folds_case_and_removes_all_whitespace():
    assert normalize_text("  Hello\tWORLD \n Ａ ") == "helloworlda"  # NFKC maps the full-width A


@pytest.mark.parametrize(
    "target, text, distance",
    [
        ("hello", "xxhelloyy", 0),  # exact substring anywhere
        ("hello", "xxhelxoyy", 1),  # one substitution
        ("hello", "helo", 1),  # one deletion
        ("hello", "heello", 1),  # one insertion
        ("abc", "", 3),  # nothing recognised: the empty substring costs len(target)
        ("abc", "xyz", 3),
        ("", "anything", 0),
        ("world", "helloworld", 0),
    ],
)
def test_best_substring_distance(target, text, distance):
    assert best_substring_distance(target, text) == distance


def test_best_substring_distance_matches_brute_force():
    import Levenshtein

    target, text = "deepgen", "the deep gen model: deepgem rl"
    text = normalize_text(text)
    brute = min(Levenshtein.distance(target, text[a:b]) for a in range(len(text) + 1) for b in range(a, len(text) + 1))
    assert best_substring_distance(target, text) == brute == 0
    target = "deepgxn"
    brute = min(Levenshtein.distance(target, text[a:b]) for a in range(len(text) + 1) for b in range(a, len(text) + 1))
    assert best_substring_distance(target, text) == brute == 1


def test_ocr_score_closed_form():
    # one segment, exact (case/space-insensitive)
    assert ocr_score('a poster "Hello World"', "HELLO  world and more") == 1.0
    # two segments: "abcd" (d=1) and "xyz" (d=0) -> 1 - 1/7
    assert ocr_score('"abcd" and "xyz"', "abed ... xyz") == pytest.approx(1 - 1 / 7)
    # nothing recognised -> 0
    assert ocr_score('"abcd"', "") == 0.0
    # no target text -> None (no score at all, not 0)
    assert ocr_score("a cat on a mat", "cat") is None
    assert ocr_score('only "  " blank quotes', "x") is None


def test_ocr_score_is_in_unit_interval():
    for text in ["", "a", "completely different text", "hello"]:
        value = ocr_score('"hello" "there"', text)
        assert 0.0 <= value <= 1.0
