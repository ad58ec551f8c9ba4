#!/bin/sh
# Install the aiscope agent as a systemd service on this node:
#   sudo sh deploy/systemd/install.sh [SOURCE]
# SOURCE is what pip installs (default: the repository this script lives in). Creates the
# "aiscope" system user, a venv in /opt/aiscope/venv, /etc/aiscope/aiscope.toml (kept if it
# exists), the unit, and enables and starts it. Run it again to upgrade.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
source=${1:-$(cd "$here/../.." && pwd)}
prefix=/opt/aiscope
unit=/etc/systemd/system/aiscope-agent.service

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (sudo sh $0)" >&2
    exit 1
fi
command -v python3 >/dev/null || { echo "install.sh: python3 (3.11+) is required" >&2; exit 1; }

if ! id aiscope >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/aiscope --no-create-home --shell /usr/sbin/nologin \
        --user-group aiscope
fi

python3 -m venv "$prefix/venv"
"$prefix/venv/bin/pip" install --quiet --upgrade "$source"

install -d -m 0755 /etc/aiscope
if [ ! -e /etc/aiscope/aiscope.toml ]; then
    cat > /etc/aiscope/aiscope.toml <<'TOML'
[agent]
interval = 1.0
raw_retention_days = 14

[thresholds]
idle_held_window_seconds = 3600
# Owners and prices for owners[] and the report's costs (README: "Owners and money"):
# [owners.teams]
# vision = ["user:alice", "namespace:cv-*", "account:cv"]
# [owners.accounts]
# cv = ["alice"]
# [prices]
# currency = "USD"
# gpu_hour = 2.50
# kwh = 0.12
# [prices.models]
# "H100" = 4.00
TOML
fi

install -m 0644 "$here/aiscope-agent.service" "$unit"
install -m 0644 "$here/aiscope-report.service" /etc/systemd/system/aiscope-report.service
install -m 0644 "$here/aiscope-report.timer" /etc/systemd/system/aiscope-report.timer
# Notices and the weekly mail: idle until /etc/aiscope/notify.toml exists (docs/deploy.md).
install -m 0644 "$here/aiscope-notify.service" /etc/systemd/system/aiscope-notify.service
install -m 0644 "$here/aiscope-notify.timer" /etc/systemd/system/aiscope-notify.timer
systemd-analyze verify "$unit" /etc/systemd/system/aiscope-report.service \
    /etc/systemd/system/aiscope-report.timer /etc/systemd/system/aiscope-notify.service \
    /etc/systemd/system/aiscope-notify.timer
systemctl daemon-reload
systemctl enable --now aiscope-agent.service aiscope-report.timer aiscope-notify.timer
systemctl --no-pager --lines=5 status aiscope-agent.service || true
echo "aiscope agent installed: metrics at http://127.0.0.1:9835/metrics, store /var/lib/aiscope"
echo "weekly reports (Mondays 06:00 UTC) in /var/lib/aiscope-reports"
