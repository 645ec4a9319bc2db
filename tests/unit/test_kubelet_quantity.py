"""The API's resource quantity (pykubelet/api/quantity.py): ParseQuantity's grammar, Value and MilliValue's
rounding and String()'s canonical DecimalSI and BinarySI forms, with cases from apimachinery's
quantity_test.go."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from pykubelet.api import quantity

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(("text", "amount"), [
    ("0", 0), ("0n", 0), ("0m", 0), ("0Ki", 0), ("0M", 0), ("0Ti", 0), ("1", 1), ("9", 9),
    # every suffix
    ("1Ki", 1 << 10), ("7Mi", 7 << 20), ("6Gi", 6 << 30), ("5Ti", 5 << 40), ("4Pi", 4 << 50), ("3Ei", 3 << 60),
    ("5n", Decimal("5e-9")), ("4u", Decimal("4e-6")), ("3m", Decimal("0.003")), ("8k", 8000), ("7M", 7 * 10**6),
    ("6G", 6 * 10**9), ("5T", 5 * 10**12), ("2P", 2 * 10**15), ("1E", 10**18),
    # exponents, either letter, either sign
    ("1E-3", Decimal("0.001")), ("1e3", 1000), ("1E6", 10**6), ("1e18", 10**18), ("1.3E+6", 1300000),
    ("0.5e-2", Decimal("0.005")), ("1.53E12", 153 * 10**10),
    # fractions
    ("100.035k", 100035), ("0.0005k", Decimal("0.5")), ("9.01", Decimal("9.01")), ("6.987654321G", 6987654321),
    ("100.035Ki", Decimal("102435.84")), ("0.5Mi", 512 << 10), ("1.5Gi", 1536 << 20),
    # signs
    ("+5", 5), ("-5", -5), ("-1.5Gi", -(1536 << 20)), ("+0.5", Decimal("0.5")),
    # written by trolls, taken all the same
    (".001", Decimal("0.001")), (".5", Decimal("0.5")), (".0001k", Decimal("0.1")), ("1.", 1), ("1.G", 10**9),
    ("+", 0), (".", 0),
])
def test_the_apis_grammar_is_read(text, amount):
    assert quantity.parse(text) == amount


@pytest.mark.parametrize(("text", "amount"), [
    # finer than 1n: rounded up to it, away from zero
    ("3.001n", Decimal("4e-9")), ("1.1E-9", Decimal("2e-9")), ("0.0000000001", Decimal("1e-9")),
    ("0.00000012345", Decimal("124e-9")), ("0.000000000001Ki", Decimal("2e-9")), ("-3.001n", Decimal("-4e-9")),
    ("1e-1000000000000", Decimal("1e-9")), ("0." + "0" * 5000 + "1", Decimal("1e-9")),
    # beyond an int64: capped (upstream caps a binary one only)
    ("9Ei", INT64_MAX), ("9223372036854775807Ki", INT64_MAX), ("-9Ei", -INT64_MAX), ("12E", INT64_MAX),
    ("1e1000000000000", INT64_MAX), ("1" * 5000, INT64_MAX), ("1e9223372036854775807", INT64_MAX),
])
def test_an_amount_is_rounded_to_nano_and_capped_at_int64(text, amount):
    assert quantity.parse(text) == amount


@pytest.mark.parametrize("text", [
    "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 ", "", "1e", "e",
    "1K", "1ki", "1kb", "1MB", "1e3.5", "1e99999999999999999999", "NaN", "Infinity", "1_000", "0x10", "--1",
])
def test_a_text_that_is_no_quantity_is_named(text):
    with pytest.raises(ValueError, match=re.escape(f"not a quantity: {text!r}")):
        quantity.parse(text)


@pytest.mark.parametrize(("text", "milli", "whole"), [
    ("1", 1000, 1), ("100m", 100, 1), ("1.5", 1500, 2), ("0.5m", 1, 1), ("1n", 1, 1), ("9.01", 9010, 10),
    ("64Mi", (64 << 20) * 1000, 64 << 20),
    ("-9.01", -9010, -10), ("-0.5m", -1, -1), ("0", 0, 0),
])
def test_milli_value_and_value_round_up_away_from_zero(text, milli, whole):
    amount = quantity.parse(text)
    assert (quantity.milli_value(amount), quantity.value(amount)) == (milli, whole)


@pytest.mark.parametrize(("amount", "text"), [
    (10**9, "1G"), (Decimal("0.001"), "1m"), (Decimal("0.08"), "80m"), (Decimal("1.08"), "1080m"),
    (300 * 10**6, "300M"), (10**12, "1T"), (1234567 * 10**6, "1234567M"), (3000, "3k"), (0, "0"),
    (Decimal("1e-9"), "1n"), (Decimal("1.08e-6"), "1080n"), (Decimal("1.08e-3"), "1080u"), (2, "2"),
    (Decimal("1.5"), "1500m"), (Decimal("0.25"), "250m"), (100035, "100035"), (-1500, "-1500"),
    (Decimal("-0.5"), "-500m"), (Decimal("1.5e-10"), "1n"), (12 * 10**18, "12E"), (10**21, "1000E"),
])
def test_a_decimal_si_amount_is_written_canonically(amount, text):
    assert quantity.decimal_si(amount) == text


@pytest.mark.parametrize(("amount", "text"), [
    (1 << 30, "1Gi"), (300 << 20, "300Mi"), (6 << 10, "6Ki"), (1001 << 30, "1001Gi"), (1 << 40, "1Ti"),
    (5, "5"), (Decimal("0.5"), "500m"), (Decimal("1234.567"), "1234567m"), (1025, "1025"), (0, "0"),
    (1536, "1536"), (3072, "3Ki"), (51200 << 10, "50Mi"), (1 << 60, "1Ei"), (1 << 70, "1024Ei"),
    (INT64_MAX, str(INT64_MAX)), (1000, "1k"), (-(2 << 20), "-2Mi"), (Decimal(1536 << 20), "1536Mi"),
])
def test_a_binary_si_amount_is_written_canonically(amount, text):
    assert quantity.binary_si(amount) == text


@pytest.mark.parametrize("text", ["1Gi", "300Mi", "1536", "250m", "1G", "1500m", "100035", "1n", "5"])
def test_a_canonical_text_is_written_back_as_it_was(text):
    amount = quantity.parse(text)
    written = quantity.binary_si(amount) if text.endswith("i") else quantity.decimal_si(amount)
    assert written == text
