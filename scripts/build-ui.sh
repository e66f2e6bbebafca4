#!/usr/bin/env bash
# Builds the web UI into app/ui/dist (committed, so running the coordinator needs no Node.js).
# Steps: install the locked npm packages, generate the API types from openapi.yaml, type-check, bundle with Vite.
# Run it after changing app/ui/src or openapi.yaml (`python -m app.openapi` first), then commit app/ui/dist.
set -euo pipefail
cd "$(dirname "$0")/../app/ui"
if ! command -v npm >/dev/null; then
  echo "build-ui: npm (Node.js 20+) is needed to build the UI; the built UI in app/ui/dist is already committed" >&2
  exit 1
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  npm ci --no-audit --no-fund
fi
npm run build
echo "build-ui: built app/ui/dist; commit it with the sources"
