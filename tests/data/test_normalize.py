"""Normalization and filter rules of the clean step (pure functions)."""

import pytest

from tidal.data.normalize import (
    FilterThresholds,
    Quarantine,
    document_id,
    filter_reason,
    letter_fraction,
    normalize_record,
    normalize_text,
)


def test_crlf_cr_and_unicode_separators_become_newlines():
    assert normalize_text("a\r\nb\rc\u2028d\u2029e") == "a\nb\nc\nd\ne"


def test_bom_stripped_and_trailing_whitespace_collapsed():
    raw = "\ufeffline one   \nline two\t\n\n  ".encode("utf-8")
    assert normalize_record(raw) == "line one\nline two"


def test_ansi_escapes_removed_without_residue():
    text = "\x1b[1;31m红色\x1b[0m and \x1b]0;title\x07plain \x1b(Bmore"
    assert normalize_text(text) == "红色 and plain more"


def test_control_chars_stripped_except_newline_and_tab():
    assert normalize_text("a\x00b\x07c\td\x7fe\x85f\ng") == "abc\tdef\ng"


def test_nfc_keeps_fullwidth_punctuation_nfkc_folds_it():
    text = "气和玉烛，睿化著鸿明。ＡＢ１"
    assert normalize_text(text, "NFC") == text
    assert normalize_text(text, "NFKC") == "气和玉烛,睿化著鸿明。AB1"


def test_nfc_composes_combining_sequences():
    assert normalize_text("e\u0301") == "\u00e9"


def test_unknown_form_is_rejected():
    with pytest.raises(ValueError, match="normalization"):
        normalize_text("x", "NFD")


def test_invalid_utf8_is_quarantined_with_byte_offset():
    result = normalize_record(b"stock market\x92s drop")
    assert isinstance(result, Quarantine)
    assert result.reason == "invalid_utf8"
    assert result.detail.startswith("byte 12:")


def test_lone_surrogate_bytes_are_invalid_utf8():
    raw = "ok \ud800".encode("utf-8", "surrogatepass")
    assert normalize_record(raw).reason == "invalid_utf8"


def test_filters_in_order():
    th = FilterThresholds(min_chars=5, max_chars=20, min_letter_fraction=0.5)
    assert filter_reason("", th) == "empty"
    assert filter_reason("abc", th) == "too_short"
    assert filter_reason("a" * 21, th) == "too_long"
    assert filter_reason("12345 678", th) == "low_letter_fraction"
    assert filter_reason("hello world", th) is None


def test_letter_fraction_counts_cjk_and_marks_ignores_whitespace():
    assert letter_fraction("气和玉烛，睿化著鸿明。") == pytest.approx(9 / 11)
    assert letter_fraction("नमस्ते") == 1.0  # Devanagari vowel signs are Mc/Mn
    assert letter_fraction("ab   \n\t  12") == 0.5
    assert letter_fraction("   ") == 0.0


def test_thresholds_are_validated():
    assert FilterThresholds.model_validate({}) == FilterThresholds()
    assert FilterThresholds.model_validate({"min_chars": 3}).min_chars == 3
    with pytest.raises(ValueError, match="min_letter_fraction"):
        FilterThresholds.model_validate({"min_letter_fraction": 1.5})
    with pytest.raises(ValueError, match="min_chars"):
        FilterThresholds.model_validate({"min_chars": 10, "max_chars": 5})
    with pytest.raises(ValueError, match="min_chars"):
        FilterThresholds.model_validate({"min_chars": True})


def test_document_id_is_sha256_of_utf8():
    assert document_id("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
