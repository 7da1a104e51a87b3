#!/bin/bash
# shellcheck shell=bash
#
# Stand-ins for the devstack functions the nova-gpu plugin calls, so that
# its phases can run against scratch files. The ini functions keep the
# semantics of devstack's inc/ini-config (a missing section is appended, a
# missing option is inserted right below its section header, an existing
# one is replaced in place); everything that would touch the system or a
# cloud is only recorded, one line per call, in $SHIM_LOG.

SHIM_LOG=${SHIM_LOG:-/dev/null}

function _shim_record {
    printf '%s\n' "$*" >> "$SHIM_LOG"
}

# _shim_ini <mode> <file> <section> <option>: the awk program behind the
# ini functions. Values travel through the environment (SHIM_VALUES,
# newline-separated) because awk -v would interpret backslashes.
function _shim_ini {
    local mode=$1 file=$2 section=$3 option=$4
    [[ -f "$file" ]] || : > "$file"
    MODE=$mode SECTION=$section OPTION=$option awk '
        function key(line,   k) {
            k = line; sub(/[ \t]*=.*/, "", k); return k
        }
        function value(line,   v) {
            v = line; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t]+$/, "", v)
            return v
        }
        function add_values(   n, i, vals) {
            n = split(ENVIRON["SHIM_VALUES"], vals, "\n")
            for (i = 1; i <= n; i++) print ENVIRON["OPTION"] " = " vals[i]
        }
        BEGIN { mode = ENVIRON["MODE"]; header = "[" ENVIRON["SECTION"] "]" }
        /^\[.*\]/ { insec = ($0 == header); if (insec) seen = 1 }
        {
            ours = insec && $0 !~ /^\[/ && $0 ~ /=/ && key($0) == ENVIRON["OPTION"]
            if (mode == "get" || mode == "has") {
                if (ours) { found = 1; print value($0) }
                next
            }
            if (ours && (mode == "delete" || mode == "multi" || replaced)) next
            if (ours && mode == "set") {
                print key($0) " = " ENVIRON["SHIM_VALUES"]; replaced = 1; next
            }
            print
            if (insec && $0 == header && (mode == "multi" || mode == "add"))
                add_values()
        }
        END {
            if (mode == "has") exit !found
            if ((mode == "multi" || mode == "add") && !seen) {
                print ""; print header; add_values()
            }
        }' "$file"
}

function _shim_rewrite {
    local file=$1 tmp
    shift
    tmp=$(mktemp)
    _shim_ini "$@" > "$tmp" && cat "$tmp" > "$file"
    rm -f "$tmp"
}

function ini_has_option {
    _shim_ini has "$1" "$2" "$3" > /dev/null
}

function iniget {
    _shim_ini get "$1" "$2" "$3" | head -n 1
}

function iniget_multiline {
    local values
    values=$(_shim_ini get "$1" "$2" "$3")
    # One line, values separated by blanks, as devstack prints them.
    echo "${values//$'\n'/ }"
}

function iniset {
    [[ "$1" == "-sudo" ]] && shift
    local file=$1 section=$2 option=$3
    [[ -n "$section" && -n "$option" ]] || return 0
    if ini_has_option "$file" "$section" "$option"; then
        SHIM_VALUES=$4 _shim_rewrite "$file" set "$file" "$section" "$option"
    else
        SHIM_VALUES=$4 _shim_rewrite "$file" add "$file" "$section" "$option"
    fi
}

function iniset_multiline {
    [[ "$1" == "-sudo" ]] && shift
    local file=$1 section=$2 option=$3
    shift 3
    local values
    # As devstack's own ("for v in $@"): each word is a value, so a value
    # with blanks comes out as one line per word.
    # shellcheck disable=SC2068
    values=$(printf '%s\n' $@)
    SHIM_VALUES=$values _shim_rewrite "$file" multi "$file" "$section" "$option"
}

function iniadd {
    [[ "$1" == "-sudo" ]] && shift
    local file=$1 section=$2 option=$3
    shift 3
    # shellcheck disable=SC2046
    iniset_multiline "$file" "$section" "$option" \
        $(iniget_multiline "$file" "$section" "$option") "$@"
}

function inidelete {
    [[ "$1" == "-sudo" ]] && shift
    _shim_rewrite "$1" delete "$1" "$2" "$3"
}

# -- services and settings ------------------------------------------------

function is_service_enabled {
    local service
    for service in "$@"; do
        [[ ",${ENABLED_SERVICES}," == *",$service,"* ]] && return 0
    done
    return 1
}

function enable_service {
    local service
    for service in "$@"; do
        is_service_enabled "$service" || \
            ENABLED_SERVICES=${ENABLED_SERVICES:+$ENABLED_SERVICES,}$service
    done
}

function disable_service {
    local service
    for service in "$@"; do
        ENABLED_SERVICES=$(echo ",$ENABLED_SERVICES," | \
            sed -e "s/,$service,/,/g" -e 's/^,//' -e 's/,$//')
    done
}

# trueorfalse <default> <variable name>, as devstack spells booleans.
function trueorfalse {
    local default=$1 value=${!2:-}
    case "$value" in
        "") echo "$default" ;;
        1|[Tt]rue|TRUE|[Yy]es|YES|[Oo]n|ON) echo True ;;
        0|[Ff]alse|FALSE|[Nn]o|NO|[Oo]ff|OFF) echo False ;;
        *) echo "$default" ;;
    esac
}

# -- recorded, not run -----------------------------------------------------

function echo_summary { _shim_record "echo_summary $*"; }
function setup_develop { _shim_record "setup_develop $*"; }
function pip_install { _shim_record "pip_install $*"; }
function install_package { _shim_record "install_package $*"; }
function run_process { _shim_record "run_process $*"; }
function stop_process { _shim_record "stop_process $*"; }
function get_python_exec_prefix { echo "${SHIM_BIN_DIR:-/opt/stack/data/venv/bin}"; }

function openstack {
    _shim_record "openstack $*"
    # "flavor show" of a name listed in SHIM_EXISTING_FLAVORS succeeds.
    if [[ "$*" == *"flavor show "* ]]; then
        [[ " ${SHIM_EXISTING_FLAVORS:-} " == *" ${*: -1} "* ]]
        return
    fi
    # Every compute service asked for is registered (its ID).
    if [[ "$*" == *"compute service list "* ]]; then
        echo 1
    fi
    return 0
}

# Directories are created for real (in the scratch area), as the current
# user, without privileges.
function sudo {
    if [[ "$1" == "install" ]]; then
        shift
        local -a args=()
        while [[ $# -gt 0 ]]; do
            case "$1" in
                -o|-g|-m) shift 2 ;;
                *) args+=("$1"); shift ;;
            esac
        done
        command install "${args[@]}"
    else
        _shim_record "sudo $*"
    fi
}

function warn {
    shift
    _shim_record "warn $*"
}

function die {
    local line=$1
    shift
    echo "ERROR (plugin.sh line $line): $*" >&2
    exit 1
}
