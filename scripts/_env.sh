# Sourced by the scripts in this folder: a virtual environment in .venv with the project
# installed as README "Set up" says, created or brought up to date when missing.
# Re-installs only when pyproject.toml changed since the last install (a stamp file).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PRIVBERT_VENV:-$ROOT/.venv}"

# pip, quiet, without the machine's notes about find-links folders that do not exist
pip_quiet() {
    "$VENV/bin/pip" --quiet --disable-pip-version-check "$@" 2>&1 \
        | sed '/^WARNING: Location .* is ignored/d' >&2
}

ensure_venv() {
    local stamp="$VENV/.privbert-installed" want
    want="$(cat "$ROOT/pyproject.toml" "$ROOT/deploy/k8s/requirements.txt" | sha256sum | cut -c1-64)"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "setting up $VENV (first run: a few minutes)" >&2
        python3 -m venv "$VENV"
    fi
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        # torch first, pinned to the CPU wheel on disk (any other torch pulls CUDA packages)
        pip_quiet install torch==2.13.0
        pip_quiet install -e "$ROOT[edge,cloud,plot,dev]"
        pip_quiet install -r "$ROOT/deploy/k8s/requirements.txt"  # deploy tools (its header)
        echo "$want" > "$stamp"
    fi
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
}

# A Debian package the tests need, installed when missing (root and apt-get only; else a
# warning: the tests that need it are skipped). $1 package, $2 a glob that exists once it is
# installed, $3 what is skipped without it.
ensure_debian_package() {
    local package="$1" present="$2" skipped="$3"
    if compgen -G "$present" >/dev/null; then
        return 0
    fi
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian package $package" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null \
            || { apt-get update -q >/dev/null && \
                 DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null; }
    else
        echo "warning: $present not found and cannot be installed here (need root and" \
             "apt-get); $skipped will be skipped" >&2
    fi
}

# PostgreSQL 15 server programs for the tests that start a throwaway cluster
# (Debian's package; initdb/pg_ctl live in /usr/lib/postgresql/15/bin, not on PATH).
ensure_postgres() {
    ensure_debian_package postgresql "/usr/lib/postgresql/*/bin/initdb" "the PostgreSQL tests"
}

# Debian's chromium for the browser test (never a browser downloaded by npm)
ensure_chromium() {
    ensure_debian_package chromium /usr/bin/chromium "the browser test"
}

# The web edge (web_edge/, npm package @privbert/edge): its node_modules installed by `npm ci`
# from package-lock.json when missing or when the lock changed (a stamp file), and its dist/
# rebuilt when a source changed (`npm ci` builds it too: the package's prepare script).
ensure_web_edge() {
    local dir="$ROOT/web_edge" stamp want built installed=0
    if ! command -v npm >/dev/null 2>&1; then
        echo "tests: npm not found: the web edge needs Node >= 20 and npm" >&2
        return 1
    fi
    stamp="$dir/node_modules/.privbert-installed"
    want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -c1-64)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "web_edge: npm ci" >&2
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) \
            || { echo "web_edge: npm ci failed (it builds dist/ with tsc too: cd web_edge && npm ci)" >&2; return 1; }
        echo "$want" > "$stamp"
        installed=1
    fi
    built="$(cat "$dir"/package.json "$dir"/tsconfig*.json $(find "$dir/src" -name '*.ts' | sort) \
             | sha256sum | cut -c1-64)"
    if [ "$installed" -eq 0 ] && [ "$(cat "$dir/dist/.privbert-built" 2>/dev/null)" != "$built" ]; then
        (cd "$dir" && npm run --silent build >&2) \
            || { echo "web_edge: the build failed (cd web_edge && npm run build)" >&2; return 1; }
    fi
    echo "$built" > "$dir/dist/.privbert-built"
}

# The privacy explorer page (web_edge/demo, served at /demo): its node_modules installed by
# `npm ci` when missing or when its lock changed, and dist/ built (`npm run build`: tsc, Vite)
# when a source of the page or the library's build changed (stamp files). After
# ensure_web_edge: the page depends on the library through file:..
ensure_web_demo() {
    local dir="$ROOT/web_edge/demo" stamp want built
    command -v npm >/dev/null 2>&1 || return 1
    stamp="$dir/node_modules/.privbert-installed"
    want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -c1-64)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "web_edge/demo: npm ci" >&2
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
        echo "$want" > "$stamp"
    fi
    built="$(cat "$dir"/index.html "$dir"/vite.config.ts "$dir"/tsconfig.json \
             "$ROOT/web_edge/dist/.privbert-built" $(find "$dir/src" -type f | sort) \
             | sha256sum | cut -c1-64)"
    if [ "$(cat "$dir/dist/.privbert-built" 2>/dev/null)" != "$built" ]; then
        (cd "$dir" && npm run --silent build >&2) \
            || { echo "web_edge/demo: the build failed (cd web_edge/demo && npm run build)" >&2; return 1; }
        echo "$built" > "$dir/dist/.privbert-built"
    fi
}
