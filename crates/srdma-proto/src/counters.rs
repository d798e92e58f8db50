//! Per-QP statistics, named like rxe's hw counters (`rxe_hw_counters.c`) so that a user can
//! compare srdma with `rdma statistic show` on kernel rxe.

use core::ops::AddAssign;

/// Counters of one QP; a device sums them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Packets handed to the network.
    pub sent_pkts: u64,
    /// Packets accepted by the QP (after the receive checks).
    pub rcvd_pkts: u64,
    /// Duplicate requests seen by the responder (re-ACKed or replayed, never re-executed).
    pub duplicate_request: u64,
    /// Requests ahead of the expected PSN (answered by one PSN-sequence NAK per gap).
    pub out_of_seq_request: u64,
    /// RNR NAKs received by the requester.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent by the responder.
    pub send_rnr_err: u64,
    /// PSN-sequence NAKs received by the requester.
    pub rcvd_seq_err: u64,
    /// Retries exhausted (RETRY_EXC_ERR).
    pub retry_exceeded_err: u64,
    /// RNR retries exhausted (RNR_RETRY_EXC_ERR).
    pub retry_rnr_exceeded_err: u64,
    /// Retransmission sequences started by the completer.
    pub completer_retry_err: u64,
    /// Send work requests completed in error.
    pub send_err: u64,
    /// SEND (and WRITE with immediate) messages sent.
    pub rdma_sends: u64,
    /// SEND (and WRITE with immediate) messages received.
    pub rdma_recvs: u64,
    /// Packets dropped by the receive checks (P_Key, Q_Key, opcode class, QP state, ghost ACKs).
    pub dropped_pkts: u64,
    /// UD packets dropped for a Q_Key mismatch (`qkey_viol_cntr`).
    pub qkey_violations: u64,
    /// Packets dropped for a P_Key mismatch (`bad_pkey_cntr`).
    pub bad_pkey: u64,
    /// Request packets sent again (go-back-N or selective retransmission).
    pub retransmitted_pkts: u64,
    /// Local ACK timeouts: the retransmission timer fired (mlx5 `local_ack_timeout_err`).
    pub local_ack_timeout_err: u64,
    /// Selective repeat: tail loss probes sent (the last packet again, after two round trips
    /// without an ACK).
    pub tlp_probes: u64,
    /// Packets received marked ECN CE (mlx5 `np_ecn_marked_roce_packets`).
    pub np_ecn_marked_roce_packets: u64,
    /// CNPs sent for them (mlx5 `np_cnp_sent`).
    pub np_cnp_sent: u64,
    /// CNPs received that cut the sending rate (mlx5 `rp_cnp_handled`).
    pub rp_cnp_handled: u64,
}

impl AddAssign for Counters {
    fn add_assign(&mut self, o: Counters) {
        self.sent_pkts += o.sent_pkts;
        self.rcvd_pkts += o.rcvd_pkts;
        self.duplicate_request += o.duplicate_request;
        self.out_of_seq_request += o.out_of_seq_request;
        self.rcvd_rnr_err += o.rcvd_rnr_err;
        self.send_rnr_err += o.send_rnr_err;
        self.rcvd_seq_err += o.rcvd_seq_err;
        self.retry_exceeded_err += o.retry_exceeded_err;
        self.retry_rnr_exceeded_err += o.retry_rnr_exceeded_err;
        self.completer_retry_err += o.completer_retry_err;
        self.send_err += o.send_err;
        self.rdma_sends += o.rdma_sends;
        self.rdma_recvs += o.rdma_recvs;
        self.dropped_pkts += o.dropped_pkts;
        self.qkey_violations += o.qkey_violations;
        self.bad_pkey += o.bad_pkey;
        self.retransmitted_pkts += o.retransmitted_pkts;
        self.local_ack_timeout_err += o.local_ack_timeout_err;
        self.tlp_probes += o.tlp_probes;
        self.np_ecn_marked_roce_packets += o.np_ecn_marked_roce_packets;
        self.np_cnp_sent += o.np_cnp_sent;
        self.rp_cnp_handled += o.rp_cnp_handled;
    }
}

impl Counters {
    /// Name and value of every counter, in rxe's order, then mlx5's congestion counters (for
    /// `devinfo --stats`).
    pub fn entries(&self) -> [(&'static str, u64); 22] {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("dropped_pkts", self.dropped_pkts),
            ("qkey_violations", self.qkey_violations),
            ("bad_pkey", self.bad_pkey),
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("local_ack_timeout_err", self.local_ack_timeout_err),
            ("tlp_probes", self.tlp_probes),
            (
                "np_ecn_marked_roce_packets",
                self.np_ecn_marked_roce_packets,
            ),
            ("np_cnp_sent", self.np_cnp_sent),
            ("rp_cnp_handled", self.rp_cnp_handled),
        ]
    }
}
