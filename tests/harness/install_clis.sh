#!/usr/bin/env bash
# Install the harness CLIs the harness tests run (tests/harness/test_clis.py), at pinned versions, into
# ${AGL_HARNESS_DIR:-~/.cache/agl-harness-clis} (outside the repository; about 750 MB together). Needs
# npm (Node.js 20+); without npm it says so and exits 0 (the tests then skip). A no-op when present.
set -euo pipefail
DIR="${AGL_HARNESS_DIR:-$HOME/.cache/agl-harness-clis}"
PINS=("opencode-ai@1.18.33" "@openai/codex@0.171.0" "@anthropic-ai/claude-code@2.1.197")
if ! command -v npm >/dev/null 2>&1; then
    echo "install_clis.sh: npm is not installed: the harness CLI tests will skip" >&2
    exit 0
fi
mkdir -p "$DIR"
if [ -f "$DIR/.pins" ] && [ "$(cat "$DIR/.pins")" = "${PINS[*]}" ] \
    && [ -x "$DIR/node_modules/.bin/opencode" ] && [ -x "$DIR/node_modules/.bin/codex" ] \
    && [ -x "$DIR/node_modules/.bin/claude" ]; then
    exit 0
fi
cd "$DIR"
[ -f package.json ] || echo '{"name": "agl-harness-clis", "private": true}' > package.json
start=$(date +%s)
npm install --no-audit --no-fund --no-save --loglevel=error "${PINS[@]}"
echo "${PINS[*]}" > .pins
echo "harness CLIs installed in $DIR ($(( $(date +%s) - start )) s)"
