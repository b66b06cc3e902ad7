/* stress/stress_main.c: the race suite's entry point: every race family, or those whose name contains argv[1]. */
#include "config.h"

#include "harness.h"

extern const struct race_def race_read_vs_bytes, race_read_vs_fin, race_read_vs_close,
	race_two_reads, race_same_listener, race_read_vs_byte_then_fin, race_delivery_vs_next_park, race_cancel_vs_bytes, race_flush_vs_completion, race_own_flush_vs_completion,
	race_flush_vs_close, race_ref_flush_vs_close, race_close_vs_send_done, race_shutdown_vs_send_done, race_vtask_register_vs_complete,
	race_conn_tasks_first_read_vs_first_flush,
	race_vtask_stale_completion, race_vtask_two_registrations, race_vtask_preset_vs_late_registrant, race_vtask_ready_registered_vs_completion,
	race_loop_read_vs_close, race_loop_flush_vs_close,
	race_pipe_read_vs_close, race_pipe_flush_vs_close, race_mem_flush_vs_consume,
	race_loop_pipe_read_vs_close, race_loop_pipe_flush_vs_close,
	race_pipe_stale_wake_vs_bytes, race_pipe_complete_vs_stale_wake, race_pipe_cancel_vs_send_done,
	race_mem_flush_vs_reader_complete, race_mem_flush_vs_reader_complete_read_parked,
	race_pipe_cancel_vs_next_flush, race_pipe_second_flush_vs_send_done, race_pipe_read_or_wait_vs_bytes,
	race_pipe_read_or_wait_unpublished_vs_bytes, race_pipe_flush_or_wait_vs_cancel, race_pipe_two_read_or_wait,
	race_loop_owner_claim,
	race_forward_vs_close, race_loop_shutdown_vs_close, race_loop_posted_ride, race_loop_shutdown_vs_flush,
	race_loop_zc_flush_vs_close;
#ifdef PERCH_HAVE_TLS
extern const struct race_def race_tls_flush_off_loop_vs_engine, race_tls_read_vs_cipher_end,
	race_tls_flush_vs_peer_end;
#endif

int main(int argc, char **argv)
{
	static const struct race_def *const all[] = {
		&race_read_vs_bytes,
		&race_read_vs_fin,
		&race_read_vs_close,
		&race_two_reads,
		&race_same_listener,
		&race_cancel_vs_bytes,
		&race_read_vs_byte_then_fin,
		&race_delivery_vs_next_park,
		&race_flush_vs_completion,
		&race_own_flush_vs_completion,
		&race_conn_tasks_first_read_vs_first_flush,
		&race_flush_vs_close,
		&race_ref_flush_vs_close,
		&race_close_vs_send_done,
		&race_shutdown_vs_send_done,
		&race_vtask_register_vs_complete,
		&race_vtask_stale_completion,
		&race_vtask_two_registrations,
		&race_vtask_preset_vs_late_registrant,
		&race_vtask_ready_registered_vs_completion,
		&race_loop_read_vs_close,
		&race_loop_flush_vs_close,
		&race_loop_zc_flush_vs_close,
		&race_pipe_read_vs_close,
		&race_pipe_flush_vs_close,
		&race_mem_flush_vs_consume,
		&race_pipe_stale_wake_vs_bytes,
		&race_pipe_complete_vs_stale_wake,
		&race_pipe_cancel_vs_send_done,
		&race_mem_flush_vs_reader_complete,
		&race_mem_flush_vs_reader_complete_read_parked,
		&race_pipe_cancel_vs_next_flush,
		&race_pipe_second_flush_vs_send_done,
		&race_pipe_read_or_wait_vs_bytes,
		&race_pipe_read_or_wait_unpublished_vs_bytes,
		&race_pipe_flush_or_wait_vs_cancel,
		&race_pipe_two_read_or_wait,
		&race_loop_pipe_read_vs_close,
		&race_loop_shutdown_vs_close,
		&race_loop_posted_ride,
		&race_loop_shutdown_vs_flush,
		&race_loop_pipe_flush_vs_close,
		&race_loop_owner_claim,
		&race_forward_vs_close,
#ifdef PERCH_HAVE_TLS
		&race_tls_flush_off_loop_vs_engine,
		&race_tls_read_vs_cipher_end,
		&race_tls_flush_vs_peer_end,
#endif
	};
	return race_main(argc, argv, all, (int)(sizeof(all) / sizeof(all[0])));
}
