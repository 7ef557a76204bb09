# Sourced, not run: a private nginx on 127.0.0.1 for the remote tests and
# benchmarks (tests/cli_remote.sh, bench/remote.sh). Never listens on any
# other address; its config, pid and logs live in the caller's directory.
#
#   . scripts/nginx-local.sh
#   nginx_local_start DIR WWW [EXTRA]    # EXTRA: lines inside server { }
#   ... $NGINX_URL (http://127.0.0.1:PORT) serves WWW; $DIR/logs/bytes.log
#       has one line "URI STATUS BODY_BYTES" a request ...
#   nginx_local_stop DIR
#
# nginx_local_start returns 77 when there is no nginx or no /usr/bin/python3
# (the caller skips), 1 when it does not start or answer (messages on
# stderr), 0 once it answers.

nginx_local_start() {
    _d=$1 _www=$2 _extra=${3:-}
    _py=/usr/bin/python3
    _nginx=$(command -v nginx || echo /usr/sbin/nginx)
    [ -x "$_nginx" ] || { echo "no nginx (scripts/install-deps.sh installs nginx-light)" >&2; return 77; }
    [ -x "$_py" ] || { echo "no $_py" >&2; return 77; }
    mkdir -p "$_d/logs"
    # a free port on 127.0.0.1
    _port=$("$_py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    # as root, nginx's workers would drop to an account that cannot read $_d
    _user=""
    [ "$(id -u)" -eq 0 ] && _user="user root;"
    cat >"$_d/nginx.conf" <<EOF
$_user
daemon on;
pid $_d/nginx.pid;
error_log $_d/logs/error.log;
worker_processes 1;
events { worker_connections 64; }
http {
    access_log $_d/logs/access.log;
    log_format bytes '\$request_uri \$status \$body_bytes_sent';
    client_body_temp_path $_d/logs; proxy_temp_path $_d/logs; fastcgi_temp_path $_d/logs;
    uwsgi_temp_path $_d/logs; scgi_temp_path $_d/logs;
    server {
        listen 127.0.0.1:$_port;
        root $_www;
        access_log $_d/logs/bytes.log bytes;
$_extra
    }
}
EOF
    "$_nginx" -c "$_d/nginx.conf" -p "$_d" 2>"$_d/nginx.err" || {
        echo "nginx did not start:" >&2; cat "$_d/nginx.err" >&2; return 1; }
    NGINX_URL="http://127.0.0.1:$_port"
    _i=0
    # any HTTP answer (403 for the directory) means it serves
    until "$_py" -c "import urllib.request, urllib.error
try: urllib.request.urlopen('$NGINX_URL/')
except urllib.error.HTTPError: pass" 2>/dev/null; do
        _i=$((_i + 1))
        [ $_i -lt 50 ] || { echo "nginx does not answer" >&2; cat "$_d/nginx.err" "$_d/logs/error.log" >&2; return 1; }
        sleep 0.1
    done
    : >"$_d/logs/bytes.log"
    return 0
}

nginx_local_stop() {
    [ -f "$1/nginx.pid" ] && kill "$(cat "$1/nginx.pid")" 2>/dev/null
    sleep 0.2
}
