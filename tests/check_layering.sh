#!/bin/sh
# Enforces the dependency rules written in libfkvf/CMakeLists.txt:
#   common/ includes nothing from codec/, format/, quant/, read/, write/,
#   search/, append/ (it holds what several modules share, among it the
#   arithmetic of quant/ and read/: cpu.h, half.h, rope.h, stage_sum.h)
#   codec/ and format/ include only common/ (and the public header)
#   read/ never includes write/, write/ never includes read/; quant/ and the
#   internal headers of other modules stay out of read/ and write/ (read/
#   uses the quantizer through fkvf.h only)
#   quant/ includes only common/
#   append/ includes common/ and write/writer_resume.h only (read/ and quant/
#   through fkvf.h)
#   search/ includes common/, codec/ and format/zidx.h only (the reader
#   and the quantizer through fkvf.h)
#   validate/ includes common/, format/ and read/reader_impl.h only (the
#   chain handle of the reader; everything else through fkvf.h), and no
#   other module includes validate/
#   tools/ include only the public header fkvf.h (and their own cacheio.h,
#   cli_util.h, cli_remote.h, cli_sample.h, commands.h, llama_state.h and gguf.h); cacheio's internal header cacheio_impl.h only in cacheio's
#   own sources (tools/cacheio.c, tools/cacheio_*.c);
#   libfkvf never includes libarchive or libcurl
#   python/fkvf (the ctypes binding over the shared library) names no
#   function of the second tier of fkvf.h (FKVF_STATIC_LINKING_ONLY: not
#   ABI-stable, for the static library only)
# usage: check_layering.sh SRCDIR
set -u
S=$1/libfkvf/src
bad=0
deny() { # deny DIR PATTERN WHY
    hits=$(grep -nE "#include \"($2)" "$S/$1"/*.[ch] 2>/dev/null)
    if [ -n "$hits" ]; then echo "layering: $1/ $3:"; echo "$hits"; bad=1; fi
}
deny common 'codec/|format/|quant/|read/|write/|search/|append/|reader|writer' "must not depend on other modules"
deny codec 'format/|quant/|read/|write/|search/|append/|validate/|reader|writer' "may use common/ only"
deny format 'codec/|quant/|read/|write/|search/|append/|validate/|reader|writer' "may use common/ only"
deny read 'write/|writer|quant/|search/|append/|validate/' "must not include the writer, quant/ internals or the modules above it"
deny write 'read/|reader|quant/|search/|append/|validate/' "must not include the reader, quant/ internals or the modules above it"
deny quant 'codec/|format/|read/|write/|search/|append/|validate/|reader|writer' "may use common/ only"
deny search 'read/|write/|quant/|append/|validate/|reader|writer|format/format' "may use common/, codec/ and format/zidx.h only (the reader and the quantizer through fkvf.h)"
deny append 'codec/|format/|read/|quant/|search/|validate/|reader|write/writer\.h|write/[a-vx-z]' "may use common/ and write/writer_resume.h only"
# allow DIR PATTERN WHY: every include "..." of DIR is one PATTERN matches
allow() {
    hits=$(grep -nE '#include "' "$S/$1"/*.[ch] 2>/dev/null | grep -vE "#include \"($2)\"")
    if [ -n "$hits" ]; then echo "layering: $1/ $3:"; echo "$hits"; bad=1; fi
}
allow validate 'fkvf\.h|alloc\.h|ckd\.h|error\.h|filemap\.h|handle\.h|hash\.h|le\.h|format/[a-z_]+\.h|read/reader_impl\.h' "may use common/, format/ and read/reader_impl.h only"
val_hits=$(grep -rnE '#include "(validate/|\.\./validate/)' "$S" 2>/dev/null | grep -v "^$S/validate/")
if [ -n "$val_hits" ]; then echo "layering: nothing includes validate/:"; echo "$val_hits"; bad=1; fi
tools_hits=$(grep -nE '#include "' "$1"/tools/*.[ch] | grep -vE '#include "(fkvf|cacheio|cli_util|cli_remote|cli_sample|commands|llama_state|gguf)\.h"' |
    grep -vE '/tools/cacheio(_[a-z]+)?\.c:[0-9]+:#include "cacheio_impl\.h"')
if [ -n "$tools_hits" ]; then echo "layering: tools/ must use the public header only:"; echo "$tools_hits"; bad=1; fi
lib_ar=$(grep -rn '#include <archive' "$S" 2>/dev/null)
if [ -n "$lib_ar" ]; then echo "layering: libarchive is for the tools, never libfkvf:"; echo "$lib_ar"; bad=1; fi
lib_curl=$(grep -rn '#include <curl' "$S" 2>/dev/null)
if [ -n "$lib_curl" ]; then echo "layering: libcurl is for the tools, never libfkvf:"; echo "$lib_curl"; bad=1; fi
# the second tier's functions: the declarations between its #if and #endif
tier2=$(sed -n '/^#if defined(FKVF_STATIC_LINKING_ONLY)/,/^#endif \/\* FKVF_STATIC_LINKING_ONLY/p' \
    "$1/libfkvf/include/fkvf.h" | grep -oE 'fkvf_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u)
if [ -z "$tier2" ]; then echo "layering: no second tier found in fkvf.h (the check broke)"; bad=1; fi
for f in $tier2; do
    py_hits=$(grep -nwF "$f" "$1"/python/fkvf/*.py 2>/dev/null)
    if [ -n "$py_hits" ]; then
        echo "layering: python/fkvf binds the shared library's first tier only, not $f:"; echo "$py_hits"; bad=1
    fi
done
if [ $bad -eq 0 ]; then echo "layering: 1 passed, 0 failed"; else echo "layering: 0 passed, 1 failed"; fi
exit $bad
