"""The API's resource quantity (apimachinery's resource.Quantity) as the kubelet needs it: the text read with
ParseQuantity's grammar into an amount, the amount counted as Value and MilliValue count it, and cpu and byte
amounts written in the canonical form String() gives a DecimalSI and a BinarySI quantity.

One reader and one writer, so that a pod's spec, the settings' thresholds and reservations, the status and the
eviction messages take and print what the API server does. It imports nothing of pykubelet: the pod-spec
readers and the settings, which sit below the rest, read quantities.
"""
from __future__ import annotations

import re
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_UP, Context, Decimal

# ParseQuantity's scanner: a sign, digits, a fraction, then the suffix's letters, its exponent's sign and digits;
# possessive, as the scanner never gives back what it took
_TEXT = re.compile(r"([+-]?+)(\d*+)(?:\.(\d*+))?+([eEinumkKMGTP]*+[+-]?+\d*+)")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {e: s for s, e in _DECIMAL_SI.items()}
_BINARY_SUFFIX = {e // 10: s for s, e in _BINARY_SI.items()}
_INT64 = 2**63
_NANO = -9  # the smallest amount a quantity holds is 1n: a finer one is rounded up to it
# exact arithmetic: the amounts are int64s with nine decimals, more digits than the default context keeps
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def parse(text: str) -> Decimal:
    """ParseQuantity: "100m", "1.5", "64Mi", "1G", "1e3", "+5", ".5" as their amount (cores, bytes, a count).
    As upstream, a finer amount than 1n is rounded up to it (away from zero), and one beyond an int64 is capped
    there (upstream caps a binary one; a decimal one it keeps, and its Value overflows). ValueError names the
    text."""
    amount = _amount(text)
    if amount is None:
        raise ValueError(f"not a quantity: {text!r}")
    return amount


def _amount(text: str) -> Decimal | None:
    m = _TEXT.fullmatch(text)
    if not text or m is None:
        return None
    sign, whole, fraction, suffix = m.group(1), m.group(2) or "0", m.group(3) or "0", m.group(4)
    amount = Decimal(f"{sign}{whole}.{fraction}")  # exact, however many digits
    if suffix in _BINARY_SI:
        return _held(_EXACT.multiply(amount, Decimal(1 << _BINARY_SI[suffix])))
    if suffix in _DECIMAL_SI:
        exponent = _DECIMAL_SI[suffix]
    elif (e := _EXPONENT.fullmatch(suffix)) is not None and -_INT64 <= int(e.group(1)) < _INT64:
        exponent = int(e.group(1))
    else:
        return None
    if amount == 0:
        return Decimal(0)
    # an exponent as large as an int64's would take the number past what a Decimal holds: decide first
    if amount.adjusted() + exponent > 19:
        return Decimal(_INT64 - 1).copy_sign(amount)
    if amount.adjusted() + exponent < _NANO - 1:
        return Decimal("1e-9").copy_sign(amount)
    return _held(amount.scaleb(exponent, context=_EXACT))


def _held(amount: Decimal) -> Decimal:
    """The amount as a quantity holds it: rounded up to 1n (away from zero), capped at an int64."""
    amount = _nano(amount)
    return amount if abs(amount) < _INT64 else Decimal(_INT64 - 1).copy_sign(amount)


def _nano(amount: Decimal) -> Decimal:
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < _NANO:
        return amount.quantize(Decimal("1e-9"), rounding=ROUND_UP, context=_EXACT)
    return amount


def value(amount: Decimal | int) -> int:
    """Value: the amount in whole units, rounded up (away from zero)."""
    return int(Decimal(amount).to_integral_value(rounding=ROUND_UP, context=_EXACT))


def milli_value(amount: Decimal | int) -> int:
    """MilliValue: the amount in thousandths (millicores), rounded up (away from zero)."""
    return int(Decimal(amount).scaleb(3, context=_EXACT).to_integral_value(rounding=ROUND_UP, context=_EXACT))


def decimal_si(amount: Decimal | int) -> str:
    """A DecimalSI quantity's String(): the largest suffix that leaves a whole number ("250m", "2", "1500m",
    "1k"). A finer amount than 1n is rounded up to it first, as the quantity would hold it; one beyond the E
    suffix keeps E, where upstream prints the digits without their suffix."""
    amount = _nano(Decimal(amount))
    sign, digits, exponent = amount.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"not an amount: {amount}")
    if amount == 0:
        return "0"
    mantissa = int(Decimal((0, digits, 0)))
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    shift = exponent % 3 if exponent <= 18 else exponent - 18
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    return f"{'-' if sign else ''}{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def binary_si(amount: Decimal | int) -> str:
    """A BinarySI quantity's String(): the largest binary suffix that leaves a whole number ("64Mi", "1536",
    "3Ki"); as DecimalSI (decimal_si) if below 1Ki in magnitude ("1k" for 1000) or not a whole number."""
    amount = Decimal(amount)
    if abs(amount) < 1024 or amount != amount.to_integral_value():
        return decimal_si(amount)
    n, power = int(amount), 0
    while n % 1024 == 0 and power < max(_BINARY_SUFFIX):
        n, power = n // 1024, power + 1
    return f"{n}{_BINARY_SUFFIX.get(power, '')}"


def milli_decimal_si(milli: int) -> str:
    """A DecimalSI milli quantity's String() (NewMilliQuantity's: a cpu in millicores): "250m", "2", "1k"."""
    return decimal_si(Decimal(milli).scaleb(-3))
