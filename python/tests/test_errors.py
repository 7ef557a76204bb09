"""Errors: FkvfError subclasses chosen by code, with file, offset, clause, field."""


from pathlib import Path

import pytest

from conftest import SAMPLE


def test_subclass_per_code(fkvf):
    import fkvf.errors as E
    # every FKVF_E_* code of fkvf.h, with the name the library gives it
    codes = list(range(1, 9)) + list(range(20, 40)) + [50]
    assert sorted(E.BY_CODE) == codes
    for c in codes:
        cls = E.BY_CODE[c]
        assert issubclass(cls, fkvf.FkvfError)
        name = fkvf._lib.lib.fkvf_error_name(c).decode()
        assert name.startswith("FKVF_E_")
        # the class name is the code's name in CamelCase: FKVF_E_BAD_MAGIC -> BadMagicError
        camel = "".join(w.capitalize() for w in name[len("FKVF_E_"):].split("_")) + "Error"
        camel = {"NomemError": "NoMemError", "IoError": "IoError"}.get(camel, camel)
        assert cls.__name__ == camel, (c, name)
        assert getattr(fkvf, camel) is cls  # exported at the top level


def test_missing_file(fkvf, tmp_path):
    p = tmp_path / "missing.fkvf"
    with pytest.raises(fkvf.FkvfError) as e:
        fkvf.open(p)
    assert isinstance(e.value, fkvf.IoError) and e.value.code == 4
    assert e.value.file == str(p)
    assert str(p) in e.value.message and "No such file" in e.value.message
    assert e.value.offset is None and e.value.error_class == "usage"


def test_truncated(fkvf, tmp_path):
    p = tmp_path / "trunc.fkvf"
    p.write_bytes(Path(SAMPLE).read_bytes()[:300000])
    with pytest.raises(fkvf.TruncatedError) as e:
        fkvf.open(p)
    err = e.value
    assert err.code == 24 and err.name == "FKVF_E_TRUNCATED" and err.error_class == "format"
    assert err.offset == 300000 and err.clause == "7.2" and err.file == str(p)


def test_bad_magic(fkvf, tmp_path):
    data = bytearray(Path(SAMPLE).read_bytes())
    data[0] ^= 0xFF
    p = tmp_path / "magic.fkvf"
    p.write_bytes(bytes(data))
    with pytest.raises(fkvf.BadMagicError) as e:
        fkvf.open(p)
    assert (e.value.offset, e.value.clause, e.value.field) == (0, "3.1", "header.magic")


def test_corrupted_exact_rows_fail_open(fkvf, tmp_path):
    data = bytearray(Path(SAMPLE).read_bytes())
    data[20000] ^= 0x01  # inside the EXAC section at 2880 (`fkvf dump testdata/sample.fkvf`)
    p = tmp_path / "corrupt.fkvf"
    p.write_bytes(bytes(data))
    with pytest.raises(fkvf.ChecksumError) as e:
        fkvf.open(p)
    assert e.value.offset == 2880 and e.value.clause == "4.6" and "EXAC" in e.value.message
    assert e.value.file == str(p) and e.value.error_class == "format"


def test_corrupted_stream_fails_read_and_verify(fkvf, tmp_path):
    data = bytearray(Path(SAMPLE).read_bytes())
    strm, end = 515008, 522816  # the index streams' STRM section (`fkvf dump`)
    data[strm + 4000] ^= 0x01
    p = tmp_path / "corrupt.fkvf"
    p.write_bytes(bytes(data))
    with fkvf.open(p) as a:  # stream blocks are checked on first touch
        a.read(positions=slice(68, 100))  # exact rows only
        with pytest.raises(fkvf.ChecksumError) as e:
            a.read()
        assert e.value.clause == "11.4" and strm <= e.value.offset < end
        with pytest.raises(fkvf.ChecksumError) as e2:
            a.verify()
        assert strm <= e2.value.offset < end


def test_torn_tail_strict(fkvf, tmp_path):
    p = tmp_path / "torn.fkvf"
    p.write_bytes(Path(SAMPLE).read_bytes() + b"\0" * 64)
    with fkvf.open(p) as a:
        assert a.info["torn_bytes"] == 64
    with pytest.raises(fkvf.TornError) as e:
        fkvf.open(p, strict=True)
    assert e.value.file == str(p)


def test_not_an_archive(fkvf, tmp_path):
    p = tmp_path / "empty.fkvf"
    p.write_bytes(b"")
    with pytest.raises(fkvf.FkvfError) as e:
        fkvf.open(p)
    assert e.value.error_class in ("format", "usage") and e.value.file == str(p)
    d = tmp_path / "dir.fkvf"
    d.mkdir()
    with pytest.raises(fkvf.FkvfError):
        fkvf.open(d)


def test_error_str_names_the_error(fkvf, tmp_path):
    with pytest.raises(fkvf.FkvfError) as e:
        fkvf.open(tmp_path / "x.fkvf")
    assert "FKVF_E_IO" in str(e.value) and str(e.value).count("FKVF_E_IO") == 1
