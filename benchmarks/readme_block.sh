# Sourced by the benchmark scripts. readme_block NAME FILE README: replaces the lines from
# `<!-- NAME:begin -->` to `<!-- NAME:end -->` of README with FILE (which holds both marker
# lines), or appends FILE after a blank line when README has no such block.
readme_block() {
    local name=$1 file=$2 readme=$3
    if grep -q "<!-- $name:begin -->" "$readme" && grep -q "<!-- $name:end -->" "$readme"; then
        awk -v block="$file" -v begin="<!-- $name:begin -->" -v end="<!-- $name:end -->" '
            index($0, begin) { while ((getline l < block) > 0) print l; skip = 1; next }
            index($0, end) { skip = 0; next }
            !skip { print }' "$readme" >"$readme.tmp" && mv "$readme.tmp" "$readme"
    else
        { echo; cat "$file"; } >>"$readme"
    fi
}
