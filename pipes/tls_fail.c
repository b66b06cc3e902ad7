/* pipes/tls_fail.c: a TLS session's failures: OpenSSL's reason in words, the failure told once, and the error queue kept empty for the calls. */
#include "config.h"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>

#include "tls_internal.h"

/* OpenSSL's reason for the failure of the last call, in words a log can carry. */
static void reason_from_ssl(struct perch_tls *s, char *why, size_t len)
{
	unsigned long e = ERR_peek_last_error();
	long verify = s->ssl ? SSL_get_verify_result(s->ssl) : X509_V_OK;
	if (ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && verify != X509_V_OK)
		snprintf(why, len, "certificate verify failed: %s", X509_verify_cert_error_string(verify));
	else if (e && ERR_reason_error_string(e))
		snprintf(why, len, "%s", ERR_reason_error_string(e));
	else if (e)
		ERR_error_string_n(e, why, len);
	else
		snprintf(why, len, "the TLS library failed without a reason");
}

void perch__tls_fail(struct perch_tls *s, int err, const char *why)
{
	if (s->state == TLS_FAILED)
		return;
	s->state = TLS_FAILED;
	s->error = err;
	if (why)
		snprintf(s->reason, sizeof(s->reason), "%s", why);
	else
		reason_from_ssl(s, s->reason, sizeof(s->reason));
	ERR_clear_error();
	s->fail_unreported = true;
	if (!s->freed && perch_timer_is_armed(&s->timer))   /* freed, it is perch_tls_end's deadline */
		perch_timer_stop(&s->timer);
}

/*
 * Before an OpenSSL call: its error queue must be empty for SSL_get_error
 * to judge the call. Looking is cheaper than clearing every slot, and the
 * queue is nearly always empty (a failure's reason is taken and cleared).
 */
void perch__tls_clear_errors(void)
{
	if (ERR_peek_error() != 0)
		ERR_clear_error();
}

/* Why the last OpenSSL call failed (not a retry): the session's failure. */
void perch__tls_fail_from_ssl(struct perch_tls *s, int ssl_error)
{
	unsigned long e = ERR_peek_last_error();
	if (s->io_error) {
		char why[96];
		snprintf(why, sizeof(why), "the ciphertext side failed: %s", strerror(-s->io_error));
		perch__tls_fail(s, s->io_error, why);
	} else if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
		   (s->cin_eof && ssl_error == SSL_ERROR_SYSCALL)) {
		perch__tls_fail(s, PERCH_TLS_TRUNCATED, "the peer ended the stream without close_notify");
	} else if (e == 0) {
		char why[64];
		snprintf(why, sizeof(why), "the TLS library failed without a reason (error %d)", ssl_error);
		perch__tls_fail(s, -EPROTO, why);
	} else {
		perch__tls_fail(s, -EPROTO, NULL);
	}
}
