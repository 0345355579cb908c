# shellcheck shell=bash
# Shared by tools/slurm_train.sh, tools/dist_train.sh and tools/slurm_lmdeploy_server.sh
# (sourced, not run). DRY_RUN=1 makes run_cmd print the command instead of running it.

# die MESSAGE...: print to stderr and exit 2 (a usage or set-up error).
die() {
    echo "error: $*" >&2
    exit 2
}

# quote_cmd ARG...: one line a shell reads back as the same arguments.
quote_cmd() {
    local out=() arg
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then
            out+=("$arg")
        else
            out+=("'${arg//\'/\'\\\'\'}'")  # ' becomes '\''
        fi
    done
    printf '%s\n' "${out[*]}"
}

# run_cmd ARG...: run the command, or print it when DRY_RUN=1.
run_cmd() {
    if [[ ${DRY_RUN:-0} == 1 ]]; then
        quote_cmd "$@"
    else
        "$@"
    fi
}

# is_count VALUE: whether VALUE is a positive integer.
is_count() {
    [[ $1 =~ ^[1-9][0-9]*$ ]]
}

# server_env FILE: the GEPO_LMDEPLOY_URL=... and GEPO_LMDEPLOY_TP=... lines that
# tools/slurm_lmdeploy_server.sh wrote, checked, one per line (for `env`).
server_env() {
    local file=$1 line url=''
    [[ -f $file ]] || die "LMDEPLOY_ADDR_FILE=$file does not exist: start" \
        "tools/slurm_lmdeploy_server.sh first (it writes the file once the server answers)"
    while IFS= read -r line || [[ -n $line ]]; do
        case $line in
            GEPO_LMDEPLOY_URL=http://* | GEPO_LMDEPLOY_URL=https://*)
                url=${line#*=}
                echo "$line"
                ;;
            GEPO_LMDEPLOY_TP=*)
                is_count "${line#*=}" || die "$file: bad line '$line'"
                echo "$line"
                ;;
            '') ;;
            *) die "$file: unexpected line '$line' (expected GEPO_LMDEPLOY_URL=... or" \
                "GEPO_LMDEPLOY_TP=...)" ;;
        esac
    done <"$file"
    [[ -n $url ]] || die "$file has no GEPO_LMDEPLOY_URL=http://HOST:PORT line"
}
