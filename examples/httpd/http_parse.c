/* examples/httpd/http_parse.c: one HTTP/1.1 request from contiguous bytes (RFC 9112 framing), and the routes' responses. */
#include "http_parse.h"

#include <stdint.h>
#include <string.h>

#define DEFAULT_MAX_HEAD  (8u << 10)
#define DEFAULT_MAX_BODY  (1u << 20)

/* ---- character classes (RFC 9110 5.6.2, 5.5) ---- */

static bool is_tchar(unsigned char c)
{
	if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return true;
	return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* field-vchar, SP or HTAB: what a header value may hold (obs-text included, as servers accept it). */
static bool is_value_char(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* What a request-target may hold: visible ASCII, no space, no control. */
static bool is_target_char(unsigned char c)
{
	return c > 0x20 && c < 0x7f;
}

static bool span_ieq(struct http_span s, const char *lit)
{
	size_t n = strlen(lit);
	if (s.len != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char a = (unsigned char)s.p[i], b = (unsigned char)lit[i];
		if (a >= 'A' && a <= 'Z')
			a = (unsigned char)(a - 'A' + 'a');
		if (b >= 'A' && b <= 'Z')
			b = (unsigned char)(b - 'A' + 'a');
		if (a != b)
			return false;
	}
	return true;
}

static struct http_span trim_ows(const char *p, size_t len)
{
	while (len && (*p == ' ' || *p == '\t'))
		p++, len--;
	while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
		len--;
	return (struct http_span){ p, len };
}

static int fail(struct http_request *req, int status, const char *reason)
{
	req->status = status;
	req->reason = reason;
	return HTTP_ERROR;
}

/*
 * Finds the line that starts at pos, looking no further than end. On true,
 * [pos, *line_end) is the line without its LF or CRLF and *next starts the
 * following one. A CR that is not right before the LF stays in the line,
 * where the character checks refuse it.
 */
static bool next_line(const char *p, size_t pos, size_t end, size_t *line_end, size_t *next)
{
	const char *lf = memchr(p + pos, '\n', end - pos);
	if (!lf)
		return false;
	size_t e = (size_t)(lf - p);
	*next = e + 1;
	*line_end = (e > pos && p[e - 1] == '\r') ? e - 1 : e;
	return true;
}

/* ---- the request line ---- */

/* "HTTP/" DIGIT "." DIGIT: 1.0 and 1.1 as such, 1.2 and up as 1.1; another major is a 505. */
static int parse_version(const char *v, size_t len, struct http_request *req)
{
	if (len != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
	    v[7] < '0' || v[7] > '9')
		return fail(req, 400, "malformed HTTP version");
	if (v[5] != '1')
		return fail(req, 505, "HTTP major version is not 1");
	req->minor = v[7] == '0' ? 0 : 1;
	return 0;
}

/* method SP request-target SP HTTP-version, single spaces as RFC 9112 3 writes it. */
static int parse_request_line(const char *p, size_t len, struct http_request *req)
{
	size_t i = 0;
	while (i < len && is_tchar((unsigned char)p[i]))
		i++;
	if (i == 0 || i == len || p[i] != ' ')
		return fail(req, 400, "malformed method in request line");
	req->method = (struct http_span){ p, i };
	size_t t = ++i;
	while (i < len && is_target_char((unsigned char)p[i]))
		i++;
	if (i == t || i == len || p[i] != ' ')
		return fail(req, 400, "malformed request target");
	req->target = (struct http_span){ p + t, i - t };
	i++;
	return parse_version(p + i, len - i, req);
}

/* ---- header fields ---- */

/* name ":" OWS value OWS; no space before the colon, no obs-fold (both 400 by RFC 9112 5). */
static int parse_header(const char *p, size_t len, struct http_request *req, struct http_header *h)
{
	if (p[0] == ' ' || p[0] == '\t')
		return fail(req, 400, "obsolete line folding in header");
	size_t i = 0;
	while (i < len && is_tchar((unsigned char)p[i]))
		i++;
	if (i == 0 || i == len || p[i] != ':')
		return fail(req, 400, "malformed header name");
	for (size_t j = i + 1; j < len; j++)
		if (!is_value_char((unsigned char)p[j]))
			return fail(req, 400, "control character in header value");
	h->name = (struct http_span){ p, i };
	h->value = trim_ows(p + i + 1, len - i - 1);
	return 0;
}

/*
 * Content-Length: 1*DIGIT, or a comma list whose members all agree (RFC
 * 9112 6.3 lets a recipient take such a list as one value). *have says
 * whether an earlier header set *out already; it must agree too. A value too
 * big for size_t saturates, so it is refused as too large, not as invalid.
 */
static int parse_content_length(struct http_span v, bool *have, size_t *out, struct http_request *req)
{
	size_t i = 0;
	do {
		while (i < v.len && (v.p[i] == ' ' || v.p[i] == '\t'))
			i++;
		size_t start = i, n = 0;
		for (; i < v.len && v.p[i] >= '0' && v.p[i] <= '9'; i++) {
			size_t d = (size_t)(v.p[i] - '0');
			n = n > (SIZE_MAX - d) / 10 ? SIZE_MAX : n * 10 + d;
		}
		if (i == start)
			return fail(req, 400, "invalid Content-Length");
		while (i < v.len && (v.p[i] == ' ' || v.p[i] == '\t'))
			i++;
		if (i < v.len && v.p[i] != ',')
			return fail(req, 400, "invalid Content-Length");
		if (*have && n != *out)
			return fail(req, 400, "conflicting Content-Length values");
		*have = true;
		*out = n;
	} while (i++ < v.len);
	return 0;
}

/* Connection: a comma list of tokens; "close" wins over "keep-alive". */
static void scan_connection(struct http_span v, bool *close, bool *keep)
{
	size_t i = 0;
	while (i < v.len) {
		size_t s = i;
		while (i < v.len && v.p[i] != ',')
			i++;
		struct http_span tok = trim_ows(v.p + s, i - s);
		if (span_ieq(tok, "close"))
			*close = true;
		else if (span_ieq(tok, "keep-alive"))
			*keep = true;
		i++;
	}
}

/* Reads the framing and persistence headers once the head is whole. */
static int interpret_headers(struct http_request *req, size_t max_body)
{
	bool have_cl = false, have_te = false, close = false, keep = false;
	unsigned hosts = 0;
	for (unsigned i = 0; i < req->nheaders; i++) {
		const struct http_header *h = &req->headers[i];
		if (span_ieq(h->name, "content-length")) {
			if (parse_content_length(h->value, &have_cl, &req->content_length, req) < 0)
				return HTTP_ERROR;
		} else if (span_ieq(h->name, "transfer-encoding")) {
			have_te = true;
		} else if (span_ieq(h->name, "connection")) {
			scan_connection(h->value, &close, &keep);
		} else if (span_ieq(h->name, "host")) {
			hosts++;
		}
	}
	if (have_te && have_cl)
		return fail(req, 400, "both Transfer-Encoding and Content-Length");
	if (have_te)
		return fail(req, 501, "Transfer-Encoding request bodies are not supported");
	if (req->minor == 1 && hosts != 1)
		return fail(req, 400, hosts ? "more than one Host header" : "HTTP/1.1 request without Host");
	if (req->content_length > max_body)
		return fail(req, 413, "Content-Length above the body limit");
	req->keep_alive = req->minor == 1 ? !close : (keep && !close);
	return 0;
}

/* ---- the request ---- */

int http_parse_request(const char *p, size_t len, const struct http_limits *lim,
		       struct http_request *req)
{
	size_t max_head = lim && lim->max_head ? lim->max_head : DEFAULT_MAX_HEAD;
	size_t max_body = lim && lim->max_body ? lim->max_body : DEFAULT_MAX_BODY;
	unsigned max_headers = lim && lim->max_headers && lim->max_headers <= HTTP_MAX_HEADERS
				       ? lim->max_headers : HTTP_MAX_HEADERS;
	/* Lines are looked for only inside the first max_head bytes: that is the whole limit. */
	size_t end = len < max_head ? len : max_head;
	size_t pos = 0, line_end, next;
	bool have_line = false;

	/* Everything but the header array, which nheaders = 0 makes empty. */
	memset(req, 0, offsetof(struct http_request, headers));
	memset(&req->content_length, 0, sizeof(*req) - offsetof(struct http_request, content_length));
	while ((have_line = next_line(p, pos, end, &line_end, &next)) && line_end == pos)
		pos = next;
	if (have_line && parse_request_line(p + pos, line_end - pos, req) < 0)
		return HTTP_ERROR;
	while (have_line) {
		pos = next;
		if (!next_line(p, pos, end, &line_end, &next))
			break;
		if (line_end == pos) {
			req->head_len = next;
			if (interpret_headers(req, max_body) < 0)
				return HTTP_ERROR;
			if (len - next < req->content_length)
				return HTTP_NEED_MORE;
			req->body = (struct http_span){ p + next, req->content_length };
			req->consumed = next + req->content_length;
			return HTTP_COMPLETE;
		}
		if (req->nheaders == max_headers)
			return fail(req, 431, "too many header fields");
		if (parse_header(p + pos, line_end - pos, req, &req->headers[req->nheaders]) < 0)
			return HTTP_ERROR;
		req->nheaders++;
	}
	if (len >= max_head)
		return fail(req, 431, "request head above the size limit");
	return HTTP_NEED_MORE;
}

const struct http_header *http_find_header(const struct http_request *req, const char *name)
{
	for (unsigned i = 0; i < req->nheaders; i++)
		if (span_ieq(req->headers[i].name, name))
			return &req->headers[i];
	return NULL;
}

/* ---- responses ---- */

/* IMF-fixdate by hand: strftime's %a and %b follow the locale, HTTP's do not. */
const char *http_date_update(struct http_date *d, time_t now)
{
	static const char days[7][4] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
	static const char months[12][4] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
					    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };
	struct tm tm;
	if (d->sec == now && d->text[0])
		return d->text;
	gmtime_r(&now, &tm);
	char *t = d->text;
	memcpy(t, days[tm.tm_wday], 3);
	t[3] = ',';
	t[4] = ' ';
	t[5] = (char)('0' + tm.tm_mday / 10);
	t[6] = (char)('0' + tm.tm_mday % 10);
	t[7] = ' ';
	memcpy(t + 8, months[tm.tm_mon], 3);
	t[11] = ' ';
	int y = tm.tm_year + 1900;
	for (int i = 15; i >= 12; i--, y /= 10)
		t[i] = (char)('0' + y % 10);
	t[16] = ' ';
	int hms[3] = { tm.tm_hour, tm.tm_min, tm.tm_sec };
	for (int i = 0; i < 3; i++) {
		t[17 + 3 * i] = (char)('0' + hms[i] / 10);
		t[18 + 3 * i] = (char)('0' + hms[i] % 10);
		t[19 + 3 * i] = i < 2 ? ':' : ' ';
	}
	memcpy(t + 26, "GMT", 4);
	d->sec = now;
	return d->text;
}

/* An output cursor: appends fail softly and the writer checks once at the end. */
struct out {
	char *p;
	size_t len, cap;
	bool overflow;
};

static void put(struct out *o, const char *s, size_t n)
{
	if (o->overflow || n > o->cap - o->len) {
		o->overflow = true;
		return;
	}
	memcpy(o->p + o->len, s, n);
	o->len += n;
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

static void put_size(struct out *o, size_t n)
{
	char b[24];
	size_t i = sizeof(b);
	do
		b[--i] = (char)('0' + n % 10);
	while ((n /= 10) != 0);
	put(o, b + i, sizeof(b) - i);
}

static const char *status_line(int status)
{
	switch (status) {
	case 200: return "HTTP/1.1 200 OK\r\n";
	case 400: return "HTTP/1.1 400 Bad Request\r\n";
	case 404: return "HTTP/1.1 404 Not Found\r\n";
	case 405: return "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\n";
	case 413: return "HTTP/1.1 413 Content Too Large\r\n";
	case 431: return "HTTP/1.1 431 Request Header Fields Too Large\r\n";
	case 501: return "HTTP/1.1 501 Not Implemented\r\n";
	case 505: return "HTTP/1.1 505 HTTP Version Not Supported\r\n";
	default: return "HTTP/1.1 500 Internal Server Error\r\n";
	}
}

enum conn_hdr { CONN_DEFAULT, CONN_CLOSE, CONN_KEEP_ALIVE };

/* One response; `send_body` false for HEAD (Content-Length still says the GET's length). */
static size_t write_response(int status, const char *ctype, const char *body, size_t body_len,
			     bool send_body, enum conn_hdr conn, const char *date, char *out, size_t cap)
{
	struct out o = { out, 0, cap, false };
	const char *sl = status_line(status);
	put(&o, sl, strlen(sl));
	PUT_LIT(&o, "Server: perch\r\nDate: ");
	put(&o, date, strlen(date));
	PUT_LIT(&o, "\r\nContent-Type: ");
	put(&o, ctype, strlen(ctype));
	PUT_LIT(&o, "\r\nContent-Length: ");
	put_size(&o, body_len);
	if (conn == CONN_CLOSE)
		PUT_LIT(&o, "\r\nConnection: close");
	else if (conn == CONN_KEEP_ALIVE)
		PUT_LIT(&o, "\r\nConnection: keep-alive");
	PUT_LIT(&o, "\r\n\r\n");
	if (send_body)
		put(&o, body, body_len);
	return o.overflow ? 0 : o.len;
}

/* The path part of the target: everything before '?'. */
static struct http_span target_path(struct http_span t)
{
	const char *q = memchr(t.p, '?', t.len);
	return (struct http_span){ t.p, q ? (size_t)(q - t.p) : t.len };
}

size_t http_respond(const struct http_request *req, const char *date, char *out, size_t cap)
{
	static const char hello[] = "Hello, World!";
	static const char json[] = "{\"message\":\"Hello, World!\"}";
	static const char not_found[] = "Not Found\n";
	static const char not_allowed[] = "Method Not Allowed\n";
	enum conn_hdr conn = !req->keep_alive ? CONN_CLOSE
			     : req->minor == 0 ? CONN_KEEP_ALIVE : CONN_DEFAULT;
	/* Methods are case-sensitive (RFC 9110 9.1): "get" is not GET. */
	bool head = req->method.len == 4 && memcmp(req->method.p, "HEAD", 4) == 0;
	bool get = req->method.len == 3 && memcmp(req->method.p, "GET", 3) == 0;
	struct http_span path = target_path(req->target);
	if (!get && !head)
		return write_response(405, "text/plain", not_allowed, sizeof(not_allowed) - 1, true,
				      conn, date, out, cap);
	if ((path.len == 10 && memcmp(path.p, "/plaintext", 10) == 0) || (path.len == 1 && path.p[0] == '/'))
		return write_response(200, "text/plain", hello, sizeof(hello) - 1, get, conn, date, out, cap);
	if (path.len == 5 && memcmp(path.p, "/json", 5) == 0)
		return write_response(200, "application/json", json, sizeof(json) - 1, get, conn, date,
				      out, cap);
	return write_response(404, "text/plain", not_found, sizeof(not_found) - 1, get, conn, date, out, cap);
}

size_t http_respond_error(int status, const char *date, char *out, size_t cap)
{
	const char *sl = status_line(status);
	/* The body repeats the reason phrase: the status line after "HTTP/1.1 NNN ", up to CR. */
	const char *phrase = sl + 13;
	size_t n = strcspn(phrase, "\r");
	char body[64];
	memcpy(body, phrase, n);
	body[n] = '\n';
	return write_response(status, "text/plain", body, n + 1, true, CONN_CLOSE, date, out, cap);
}
