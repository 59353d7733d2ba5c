// Helpers for the lab's ns-3 medium process, compiled at run time through cppyy.
// Everything that runs per frame or per timer lives here so the Python
// interpreter is never entered from the simulator's event loop.
#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hoplab
{
using namespace ns3;

// Packet tag carrying the index of the node whose MAC accepted the frame.
class TxNodeTag : public Tag
{
  public:
    uint32_t node{0};
    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("hoplab::TxNodeTag").SetParent<Tag>().AddConstructor<TxNodeTag>();
        return tid;
    }
    TypeId GetInstanceTypeId() const override { return GetTypeId(); }
    uint32_t GetSerializedSize() const override { return 4; }
    void Serialize(TagBuffer i) const override { i.WriteU32(node); }
    void Deserialize(TagBuffer i) override { node = i.ReadU32(); }
    void Print(std::ostream& os) const override { os << "node=" << node; }
};

struct Counters
{
    uint64_t mac_tx{0};          // frames handed to the MAC (from the tap)
    uint64_t mac_rx{0};          // frames delivered up by the MAC
    uint64_t phy_tx{0};          // PPDUs put on the air (data, retries, ACK, RTS/CTS)
    uint64_t phy_rx_ok{0};       // PPDUs received correctly
    uint64_t phy_rx_drop{0};     // PPDUs dropped by the PHY (any reason)
    uint64_t phy_rx_collision{0}; // dropped while already receiving / preamble lost to interference
    uint64_t imposed_loss{0};    // frames dropped by the per-link loss model
    uint64_t retries{0};         // failed unicast data attempts (MacTxDataFailed)
    uint64_t final_failures{0};  // frames given up after the retry limit
    uint64_t rts_failed{0};
    uint64_t tid_count[8]{0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t queue_full{0};      // frames the MAC queue refused (full)
    uint64_t queue_expired{0};   // frames dropped after waiting in the MAC queue past its lifetime
    // Airtime this node's PPDUs took, in microseconds, by what they carried: data frames of at
    // least AIR_LARGE_BYTES (payload), smaller data frames (transport control, TCP ACKs,
    // routing), MAC control and management frames (ACK, RTS, CTS, beacons), and of the data
    // frames those sent again by the MAC (Retry bit set).
    uint64_t air_large_us{0};
    uint64_t air_small_us{0};
    uint64_t air_mac_us{0};
    uint64_t air_retry_us{0};
    // Time the PHY spent in each state, in microseconds (WifiPhyStateHelper "State"): idle,
    // carrier sensed busy without receiving, transmitting, receiving.
    uint64_t state_idle_us{0};
    uint64_t state_cca_us{0};
    uint64_t state_tx_us{0};
    uint64_t state_rx_us{0};
    uint64_t state_logged_until_us{0}; // end of the last state period the trace reported
    // Time the node's MAC held at least one frame (queued or in flight) in any access
    // category, and in the data categories (best effort and background), in microseconds:
    // whether a node that seldom sends had nothing to send or could not get the air.
    uint64_t queued_us{0};
    uint64_t queued_data_us{0};
    uint64_t queue_logged_until_us{0}; // end of the period the two counters cover
    uint8_t queue_any{0};              // the MAC held a frame at queue_logged_until_us
    uint8_t queue_data{0};
    uint8_t queue_pending{0};          // a re-count is scheduled
};

// MPDUs of at least this many bytes count as payload in the airtime split; Hop's BSYN/BACK,
// TCP's ACKs and OLSR's messages are all well below it, full data frames well above.
static const uint32_t AIR_LARGE_BYTES = 400;

static std::vector<Counters> g_counters;
static std::vector<std::vector<double>> g_per; // g_per[tx][rx] frame loss probability
static std::vector<uint8_t> g_down;            // node muted and deaf
static Ptr<MatrixPropagationLossModel> g_matrix;
static std::vector<Ptr<MobilityModel>> g_mob;
static std::vector<std::vector<double>> g_db; // configured path loss per directed pair
static bool g_classify{true};
// Frames for another MAC go to the taps too (a packet socket there overhears them).
static bool g_overhear{false};

static uint8_t
TidForDscp(uint8_t dscp)
{
    // EF -> TID 6 (AC_VO), CS1 -> TID 1 (AC_BK), everything else -> TID 0 (AC_BE).
    if (dscp == 46)
        return 6;
    if (dscp == 8)
        return 1;
    return 0;
}

static void
OnMacTx(uint32_t node, Ptr<const Packet> p)
{
    Ptr<Packet> m = ConstCast<Packet>(p);
    TxNodeTag tag;
    tag.node = node;
    m->ReplacePacketTag(tag);
    g_counters[node].mac_tx++;
    uint8_t tid = 0;
    if (g_classify)
    {
        Ptr<Packet> c = p->Copy();
        LlcSnapHeader llc;
        if (c->GetSize() >= llc.GetSerializedSize() + 20)
        {
            c->RemoveHeader(llc);
            if (llc.GetType() == 0x0800)
            {
                uint8_t first[2];
                c->CopyData(first, 2);
                tid = TidForDscp(first[1] >> 2);
            }
        }
        SocketPriorityTag prio;
        prio.SetPriority(tid);
        m->ReplacePacketTag(prio);
    }
    g_counters[node].tid_count[tid & 7]++;
}

static void OnMacRx(uint32_t node, Ptr<const Packet>) { g_counters[node].mac_rx++; }
static void OnPhyTx(uint32_t node, Ptr<const Packet>, double) { g_counters[node].phy_tx++; }

static void
OnPsduTx(uint32_t node, WifiPhyBand band, WifiConstPsduMap psdus, WifiTxVector tx, double)
{
    auto us = static_cast<uint64_t>(WifiPhy::CalculateTxDuration(psdus, tx, band).GetMicroSeconds());
    Counters& c = g_counters[node];
    auto it = psdus.begin();
    if (it == psdus.end() || !it->second || it->second->GetNMpdus() == 0)
    {
        c.air_mac_us += us;
        return;
    }
    const WifiMacHeader& h = it->second->GetHeader(0);
    if (!h.IsData())
    {
        c.air_mac_us += us;
        return;
    }
    if (it->second->GetSize() >= AIR_LARGE_BYTES)
        c.air_large_us += us;
    else
        c.air_small_us += us;
    if (h.IsRetry())
        c.air_retry_us += us;
}

static void
AddStateTime(Counters& c, WifiPhyState state, uint64_t us)
{
    switch (state)
    {
    case WifiPhyState::IDLE:
        c.state_idle_us += us;
        break;
    case WifiPhyState::CCA_BUSY:
        c.state_cca_us += us;
        break;
    case WifiPhyState::TX:
        c.state_tx_us += us;
        break;
    case WifiPhyState::RX:
        c.state_rx_us += us;
        break;
    default:
        break;
    }
}

// The helper reports a state period when it ends; CountersOf adds the one still running.
static void
OnPhyState(uint32_t node, Time start, Time duration, WifiPhyState state)
{
    Counters& c = g_counters[node];
    AddStateTime(c, state, static_cast<uint64_t>(duration.GetMicroSeconds()));
    c.state_logged_until_us = static_cast<uint64_t>((start + duration).GetMicroSeconds());
}

static void OnPhyRxEnd(uint32_t node, Ptr<const Packet>) { g_counters[node].phy_rx_ok++; }

static void
OnPhyRxDrop(uint32_t node, Ptr<const Packet>, WifiPhyRxfailureReason r)
{
    g_counters[node].phy_rx_drop++;
    if (r == RXING || r == PREAMBLE_DETECT_FAILURE || r == BUSY_DECODING_PREAMBLE ||
        r == RECEPTION_ABORTED_BY_TX || r == TXING || r == FRAME_CAPTURE_PACKET_SWITCH ||
        r == PREAMBLE_DETECTION_PACKET_SWITCH || r == L_SIG_FAILURE || r == UNKNOWN)
    {
        g_counters[node].phy_rx_collision++;
    }
}

static void OnDataFailed(uint32_t node, Mac48Address) { g_counters[node].retries++; }
static void OnFinalDataFailed(uint32_t node, Mac48Address) { g_counters[node].final_failures++; }
static void OnRtsFailed(uint32_t node, Mac48Address) { g_counters[node].rts_failed++; }
// Frames the MAC dropped before any attempt: the queue was full, or they waited in it past
// WifiMacQueue's MaxDelay (500 ms by default). Retry-limit drops are final_failures.
static void
OnDroppedMpdu(uint32_t node, WifiMacDropReason reason, Ptr<const WifiMpdu>)
{
    if (reason == WIFI_MAC_DROP_FAILED_ENQUEUE)
        g_counters[node].queue_full++;
    else if (reason == WIFI_MAC_DROP_EXPIRED_LIFETIME)
        g_counters[node].queue_expired++;
}

// ---- MAC queue occupancy -----------------------------------------------------------------
static std::vector<Ptr<WifiMac>> g_mac; // per node, for the occupancy counters

// Frames `mac` holds (queued or in flight), in every access category or only in the data
// categories (best effort and background).
static uint32_t
MacFrames(Ptr<WifiMac> mac, bool data_only)
{
    uint32_t n = 0;
    for (AcIndex ac : {AC_BE, AC_BK, AC_VI, AC_VO})
    {
        if (data_only && ac != AC_BE && ac != AC_BK)
            continue;
        Ptr<WifiMacQueue> q = mac->GetTxopQueue(ac);
        if (q)
            n += q->GetNPackets();
    }
    return n;
}

static void
AddQueueTime(Counters& c, uint64_t now_us)
{
    if (now_us <= c.queue_logged_until_us)
        return;
    uint64_t us = now_us - c.queue_logged_until_us;
    if (c.queue_any)
        c.queued_us += us;
    if (c.queue_data)
        c.queued_data_us += us;
    c.queue_logged_until_us = now_us;
}

// Runs once the queue event that scheduled it has run its course: credits the period since
// the last count to the old state, then counts the frames the node's MAC holds now.
static void
RecountQueue(uint32_t node)
{
    Counters& c = g_counters[node];
    c.queue_pending = 0;
    AddQueueTime(c, static_cast<uint64_t>(Simulator::Now().GetMicroSeconds()));
    c.queue_any = MacFrames(g_mac[node], false) > 0;
    c.queue_data = MacFrames(g_mac[node], true) > 0;
}

static void
OnQueueChange(uint32_t node, Ptr<const WifiMpdu>)
{
    Counters& c = g_counters[node];
    if (c.queue_pending)
        return;
    c.queue_pending = 1;
    Simulator::ScheduleNow(&RecountQueue, node);
}

static void
TrackQueues(uint32_t node, Ptr<WifiMac> mac)
{
    if (g_mac.size() <= node)
        g_mac.resize(node + 1);
    g_mac[node] = mac;
    for (AcIndex ac : {AC_BE, AC_BK, AC_VI, AC_VO})
    {
        Ptr<WifiMacQueue> q = mac->GetTxopQueue(ac);
        if (!q)
            continue;
        q->TraceConnectWithoutContext("Enqueue",
                                      MakeBoundCallback(&OnQueueChange, node));
        q->TraceConnectWithoutContext("Dequeue",
                                      MakeBoundCallback(&OnQueueChange, node));
        q->TraceConnectWithoutContext("Drop",
                                      MakeBoundCallback(&OnQueueChange, node));
        q->TraceConnectWithoutContext("Expired",
                                      MakeBoundCallback(&OnQueueChange, node));
    }
}

// Drops frames received by one node with the loss probability of the directed link
// from the transmitter (identified by TxNodeTag). Frames without the tag (ACK, CTS)
// are never dropped here.
class LinkLossModel : public ErrorModel
{
  public:
    uint32_t rx{0};
    Ptr<UniformRandomVariable> rng;
    static TypeId GetTypeId()
    {
        static TypeId tid = TypeId("hoplab::LinkLossModel").SetParent<ErrorModel>();
        return tid;
    }
    LinkLossModel() { rng = CreateObject<UniformRandomVariable>(); }

  private:
    bool DoCorrupt(Ptr<Packet> p) override
    {
        TxNodeTag tag;
        if (!p->PeekPacketTag(tag) || tag.node >= g_per.size())
            return false;
        double loss = g_per[tag.node][rx];
        if (loss <= 0.0)
            return false;
        if (rng->GetValue() < loss)
        {
            g_counters[rx].imposed_loss++;
            return true;
        }
        return false;
    }
    void DoReset() override {}
};

// ---- link ARQ per access category ---------------------------------------------
// ns-3 has one FrameRetryLimit per MAC. Hop §4.1 disables link-layer ARQ for its data
// frames only and keeps it for BSYN/BACK, which a driver does per frame. This fixed-rate
// station manager gives up a unicast QoS data frame of a TID in `NoRetryTids` (bit i =
// TID i) after its first failed attempt; every other frame keeps the MAC's retry limit.
// The frame is still acknowledged by its receiver, so a missed ACK ends a TXOP burst as
// for any unicast frame, and the contention window is reset as after a final failure.
class NoRetryTidWifiManager : public ConstantRateWifiManager
{
  public:
    uint32_t no_retry_tids{0};
    static TypeId GetTypeId()
    {
        static TypeId tid =
            TypeId("hoplab::NoRetryTidWifiManager")
                .SetParent<ConstantRateWifiManager>()
                .AddConstructor<NoRetryTidWifiManager>()
                .AddAttribute("NoRetryTids",
                              "Bit mask of the TIDs whose unicast frames are never retried",
                              UintegerValue(0),
                              MakeUintegerAccessor(&NoRetryTidWifiManager::no_retry_tids),
                              MakeUintegerChecker<uint32_t>(0, 255));
        return tid;
    }

  private:
    std::list<Ptr<WifiMpdu>> DoGetMpdusToDropOnTxFailure(WifiRemoteStation*, Ptr<WifiPsdu> psdu) override
    {
        std::list<Ptr<WifiMpdu>> drop;
        for (const auto& mpdu : *PeekPointer(psdu))
        {
            const WifiMacHeader& h = mpdu->GetHeader();
            // In flight: the frame went on the air and its ACK is missing. Not in flight: it
            // lost an internal collision to a higher access category of the same node (ns-3
            // peeks the head of the losing queue), which never reaches the air; a no-retry
            // frame then waits for its one transmission instead of being discarded unsent.
            bool no_retry = h.IsQosData() && ((no_retry_tids >> h.GetQosTid()) & 1u) &&
                            mpdu->IsInFlight();
            if (no_retry || mpdu->GetRetryCount() >= GetMac()->GetFrameRetryLimit())
                drop.push_back(mpdu);
        }
        return drop;
    }
};

// Registers the station manager's TypeId so that WifiHelper can name it.
std::string
NoRetryTidManagerName()
{
    return NoRetryTidWifiManager::GetTypeId().GetName();
}

// ---- one channel per sender ---------------------------------------------------
// YansWifiChannel::Send schedules a reception event at every other PHY on the channel,
// and a PHY out of range (1000 dB) drops it on arrival as too weak: with 20 nodes and
// about six in range, two thirds of the loop's reception events did nothing. So each node
// transmits on a channel of its own whose PHYs are the nodes it has (or had) a link to;
// every PHY still listens on the channels of all its neighbours. The loss model is the
// same matrix, so what each node receives, and at what power, does not change; a link
// configured during the run adds the receiver to the sender's channel.
static std::vector<Ptr<YansWifiChannel>> g_chan; // g_chan[i]: the channel node i sends on
static std::vector<Ptr<YansWifiPhy>> g_phy;
static std::vector<std::vector<uint8_t>> g_listens; // g_listens[i][j]: j's PHY is on g_chan[i]
static Ptr<PropagationDelayModel> g_delay;

static void
ApplyDb(uint32_t a, uint32_t b)
{
    double db = (g_down[a] || g_down[b]) ? 1000.0 : g_db[a][b];
    g_matrix->SetLoss(g_mob[a], g_mob[b], db, false);
    if (g_db[a][b] < 1000.0 && a < g_chan.size() && g_chan[a] && g_phy[b] && !g_listens[a][b])
    {
        g_chan[a]->Add(g_phy[b]);
        g_listens[a][b] = 1;
    }
}

void
Setup(uint32_t n,
      Ptr<MatrixPropagationLossModel> m,
      Ptr<PropagationDelayModel> delay,
      bool classify,
      bool overhear)
{
    g_overhear = overhear;
    g_counters.assign(n, Counters{});
    g_per.assign(n, std::vector<double>(n, 0.0));
    g_db.assign(n, std::vector<double>(n, 1000.0));
    g_down.assign(n, 0);
    g_mob.assign(n, nullptr);
    g_chan.assign(n, nullptr);
    g_phy.assign(n, nullptr);
    g_listens.assign(n, std::vector<uint8_t>(n, 0));
    g_matrix = m;
    g_delay = delay;
    g_classify = classify;
}

// Moves node `node`'s PHY to a channel of its own (before any link is set).
static void
OwnChannel(uint32_t node, Ptr<WifiNetDevice> dev)
{
    Ptr<YansWifiPhy> phy = DynamicCast<YansWifiPhy>(dev->GetPhy());
    Ptr<YansWifiChannel> c = CreateObject<YansWifiChannel>();
    c->SetPropagationLossModel(g_matrix);
    c->SetPropagationDelayModel(g_delay);
    phy->SetChannel(c); // the PHY sends on c (and is on c's list, which Send skips)
    g_chan[node] = c;
    g_phy[node] = phy;
}

void
SetMobility(uint32_t i, Ptr<MobilityModel> mm)
{
    g_mob[i] = mm;
}

void
SetLink(uint32_t a, uint32_t b, double db, double per)
{
    g_db[a][b] = db;
    g_per[a][b] = per;
    ApplyDb(a, b);
}

void
SetNodeDown(uint32_t a, bool down)
{
    g_down[a] = down ? 1 : 0;
    for (uint32_t o = 0; o < g_down.size(); o++)
    {
        if (o == a)
            continue;
        ApplyDb(a, o);
        ApplyDb(o, a);
    }
}

void
Hook(uint32_t node, Ptr<WifiNetDevice> dev, Mac48Address addr, int64_t stream)
{
    dev->SetAddress(addr);
    Ptr<WifiMac> mac = dev->GetMac();
    for (uint8_t l = 0; l < mac->GetNLinks(); l++)
    {
        mac->GetFrameExchangeManager(l)->SetAddress(addr);
    }
    mac->TraceConnectWithoutContext("MacTx", MakeBoundCallback(&OnMacTx, node));
    mac->TraceConnectWithoutContext("MacRx", MakeBoundCallback(&OnMacRx, node));
    mac->TraceConnectWithoutContext("DroppedMpdu", MakeBoundCallback(&OnDroppedMpdu, node));
    Ptr<WifiPhy> phy = dev->GetPhy();
    phy->TraceConnectWithoutContext("PhyTxBegin", MakeBoundCallback(&OnPhyTx, node));
    phy->TraceConnectWithoutContext("PhyTxPsduBegin",
                                    MakeBoundCallback(&OnPsduTx, node, phy->GetPhyBand()));
    phy->GetState()->TraceConnectWithoutContext("State", MakeBoundCallback(&OnPhyState, node));
    phy->TraceConnectWithoutContext("PhyRxEnd", MakeBoundCallback(&OnPhyRxEnd, node));
    phy->TraceConnectWithoutContext("PhyRxDrop", MakeBoundCallback(&OnPhyRxDrop, node));
    Ptr<WifiRemoteStationManager> rsm = dev->GetRemoteStationManager();
    rsm->TraceConnectWithoutContext("MacTxDataFailed", MakeBoundCallback(&OnDataFailed, node));
    rsm->TraceConnectWithoutContext("MacTxFinalDataFailed",
                                    MakeBoundCallback(&OnFinalDataFailed, node));
    rsm->TraceConnectWithoutContext("MacTxRtsFailed", MakeBoundCallback(&OnRtsFailed, node));
    Ptr<LinkLossModel> em = CreateObject<LinkLossModel>();
    em->rx = node;
    em->rng->SetStream(stream);
    phy->SetPostReceptionErrorModel(em);
    OwnChannel(node, dev);
    TrackQueues(node, mac);
}

void
SetTxop(Ptr<WifiNetDevice> dev, uint8_t ac, double us)
{
    Ptr<QosTxop> q = dev->GetMac()->GetQosTxop(AcIndex(ac));
    if (q)
        q->SetTxopLimit(MicroSeconds(int64_t(us)));
}

// ---- tap ports: each node's tap joined to its WifiNetDevice ----------------------
// The event loop is the medium's bottleneck (docs/lab.md), so it does no system calls
// for frames: a reader thread waits on all taps and hands each frame to the loop as an
// event, and a writer thread writes the frames the devices received to the taps. The
// loop only copies bytes. Like a real NIC (not in monitor mode), a node's tap gets the
// frames addressed to it and broadcast/multicast frames, not other nodes' unicast.
struct TapCounters
{
    uint64_t from_tap{0};     // frames read from taps and handed to the devices
    uint64_t to_tap{0};       // frames written to taps
    uint64_t other_host{0};   // received unicast frames for another node (not written)
    uint64_t bad_frames{0};   // frames from a tap that are not Ethernet II
    uint64_t write_errors{0}; // writes that failed (e.g. the tap was down)
    uint64_t queue_drops{0};  // frames dropped because the writer fell too far behind
};

struct OutFrame
{
    uint32_t node;
    uint32_t len;
    uint8_t* data;
};

static std::vector<int> g_tap_fd;
static std::vector<Ptr<WifiNetDevice>> g_tap_dev;
// ns-3 node id of each tap's device, for the reader thread: ns-3's reference counts are not
// atomic, so that thread must not take a Ptr to any object the event loop uses (a Ptr<Node>
// from GetNode() there raced the loop's own and corrupted the node's count: a 30-minute
// run aborted in SimpleRefCount::Ref after 417 s).
static std::vector<uint32_t> g_tap_ctx;
static TapCounters g_tap; // from_tap, other_host, bad_frames, queue_drops: loop thread
static uint64_t g_tap_written{0}, g_tap_write_errors{0}; // writer thread
static std::mutex g_wmu;
static std::condition_variable g_wcv;
static std::vector<OutFrame> g_wq;
static bool g_wstop{false};
static const size_t WRITE_QUEUE_MAX = 50000;
// Waking a blocked thread costs the waker a system call and an inter-processor interrupt,
// about 6 % of the event loop when it woke the writer for every frame. So while frames keep
// coming the writer polls the queue every WRITER_NAP (a frame waits at most that long),
// and blocks, to be woken by the loop, only after WRITER_IDLE without frames.
static const std::chrono::microseconds WRITER_NAP{100};
static const std::chrono::milliseconds WRITER_IDLE{5};
static std::atomic<bool> g_writer_blocked{false};

static std::thread g_reader, g_writer;
static int g_epfd{-1}, g_stopfd{-1};
static const uint32_t STOP_KEY = 0xffffffffu;
static const int READ_BURST = 64; // frames read from one tap before looking at the others

static bool
DiscardRx(Ptr<NetDevice>, Ptr<const Packet>, uint16_t, const Address&)
{
    return true;
}

static bool
DeviceRx(uint32_t node,
         Ptr<NetDevice>,
         Ptr<const Packet> p,
         uint16_t protocol,
         const Address& from,
         const Address& to,
         NetDevice::PacketType type)
{
    if (type == NetDevice::PACKET_OTHERHOST)
    {
        g_tap.other_host++;
        if (!g_overhear)
        {
            return true;
        }
    }
    uint32_t len = 14 + p->GetSize();
    uint8_t* buf = static_cast<uint8_t*>(std::malloc(len));
    if (buf == nullptr)
    {
        g_tap.queue_drops++;
        return true;
    }
    Mac48Address::ConvertFrom(to).CopyTo(buf);
    Mac48Address::ConvertFrom(from).CopyTo(buf + 6);
    buf[12] = uint8_t(protocol >> 8);
    buf[13] = uint8_t(protocol & 0xff);
    p->CopyData(buf + 14, p->GetSize());
    {
        std::lock_guard<std::mutex> lk(g_wmu);
        if (g_wq.size() >= WRITE_QUEUE_MAX)
        {
            g_tap.queue_drops++;
            std::free(buf);
            return true;
        }
        g_wq.push_back(OutFrame{node, len, buf});
    }
    // The writer sets the flag under the lock before it waits, so a push that finds it
    // clear is one the writer will see when it next polls.
    if (g_writer_blocked.load())
        g_wcv.notify_one();
    return true;
}

static void
WriterLoop()
{
    std::vector<OutFrame> batch;
    auto last = std::chrono::steady_clock::now();
    while (true)
    {
        {
            std::unique_lock<std::mutex> lk(g_wmu);
            if (g_wq.empty())
            {
                if (g_wstop)
                    return; // stopped and drained
                if (std::chrono::steady_clock::now() - last < WRITER_IDLE)
                {
                    lk.unlock();
                    std::this_thread::sleep_for(WRITER_NAP);
                    continue;
                }
                g_writer_blocked.store(true);
                g_wcv.wait(lk, [] { return g_wstop || !g_wq.empty(); });
                g_writer_blocked.store(false);
                if (g_wq.empty())
                    return;
            }
            batch.swap(g_wq);
        }
        for (const OutFrame& f : batch)
        {
            ssize_t w = ::write(g_tap_fd[f.node], f.data, f.len);
            if (w == ssize_t(f.len))
                g_tap_written++;
            else
                g_tap_write_errors++;
            std::free(f.data);
        }
        batch.clear();
        last = std::chrono::steady_clock::now();
    }
}

// ---- link status: each node's transmit backlog, reported to the node -------------
// The tap driver orphans a frame as the medium reads it, so a node's sockets never fill
// while its MAC queue does (docs/lab.md, known gaps). On a real interface a frame stays
// charged to its socket until the driver has sent it. With link status on, the medium
// tells a node how many frames its MAC still holds (queued or in flight, all access
// categories) whenever that number falls: one datagram to the node's Unix socket, the way
// a driver reports transmit status. Layout (big-endian): "HLQ1", backlog (u32), frames
// read from the node's tap so far (u64). A node that is not listening loses the report.
static int g_status_fd = -1;
static std::vector<sockaddr_un> g_status_addr;   // per node; empty sun_path: off
static std::vector<Ptr<WifiMac>> g_status_mac;
static std::vector<uint8_t> g_status_pending;
static std::vector<uint64_t> g_status_taken;     // frames read from the tap (loop thread)
static uint64_t g_status_sent{0}, g_status_errors{0};

static uint32_t
MacBacklog(uint32_t node)
{
    return MacFrames(g_status_mac[node], false);
}

static void
SendStatus(uint32_t node)
{
    g_status_pending[node] = 0;
    uint8_t msg[16] = {'H', 'L', 'Q', '1'};
    uint32_t b = MacBacklog(node);
    uint64_t t = g_status_taken[node];
    for (int i = 0; i < 4; i++)
        msg[4 + i] = uint8_t(b >> (24 - 8 * i));
    for (int i = 0; i < 8; i++)
        msg[8 + i] = uint8_t(t >> (56 - 8 * i));
    const sockaddr_un& a = g_status_addr[node];
    ssize_t r = ::sendto(g_status_fd, msg, sizeof(msg), MSG_DONTWAIT,
                         reinterpret_cast<const sockaddr*>(&a), sizeof(a));
    if (r == ssize_t(sizeof(msg)))
        g_status_sent++;
    else
        g_status_errors++;
}

// A frame left one of the node's MAC queues (sent and acknowledged, sent without
// acknowledgement, dropped or expired): report once the event has run its course.
static void
OnQueueOut(uint32_t node, Ptr<const WifiMpdu>)
{
    if (g_status_pending[node])
        return;
    g_status_pending[node] = 1;
    Simulator::ScheduleNow(&SendStatus, node);
}

// Report node `node`'s backlog to the Unix datagram socket at `path`; returns an error
// text, empty on success.
std::string
SetLinkStatus(uint32_t node, Ptr<WifiNetDevice> dev, std::string path)
{
    if (g_status_fd < 0)
    {
        g_status_fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (g_status_fd < 0)
            return std::string("link status socket: ") + std::strerror(errno);
    }
    sockaddr_un a{};
    if (path.size() >= sizeof(a.sun_path))
        return "link status path too long: " + path;
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    if (g_status_addr.size() <= node)
    {
        g_status_addr.resize(node + 1, sockaddr_un{});
        g_status_mac.resize(node + 1);
        g_status_pending.resize(node + 1, 0);
        g_status_taken.resize(node + 1, 0);
    }
    g_status_addr[node] = a;
    g_status_mac[node] = dev->GetMac();
    for (AcIndex ac : {AC_BE, AC_BK, AC_VI, AC_VO})
    {
        Ptr<WifiMacQueue> q = dev->GetMac()->GetTxopQueue(ac);
        if (!q)
            continue;
        q->TraceConnectWithoutContext("Dequeue", MakeBoundCallback(&OnQueueOut, node));
        q->TraceConnectWithoutContext("Drop", MakeBoundCallback(&OnQueueOut, node));
        q->TraceConnectWithoutContext("Expired", MakeBoundCallback(&OnQueueOut, node));
    }
    return "";
}

// Reports sent, and reports the kernel refused (no node listening yet, or its buffer full).
std::vector<uint64_t>
LinkStatusCounters()
{
    return {g_status_sent, g_status_errors};
}

// Runs in the event loop: a frame read from node `node`'s tap goes to its device.
static void
FromTap(uint32_t node, uint8_t* buf, uint32_t len)
{
    uint16_t type = len >= 14 ? uint16_t((buf[12] << 8) | buf[13]) : 0;
    if (type < 0x0600) // too short, or an 802.3 length field: not IP/ARP
    {
        g_tap.bad_frames++;
        std::free(buf);
        return;
    }
    Mac48Address dst;
    dst.CopyFrom(buf);
    Ptr<Packet> p = Create<Packet>(buf + 14, len - 14);
    std::free(buf);
    g_tap.from_tap++;
    if (node < g_status_taken.size())
        g_status_taken[node]++;
    g_tap_dev[node]->Send(p, dst, type);
}

static void
ReaderLoop()
{
    epoll_event evs[32];
    std::vector<uint8_t> buf(65536);
    while (true)
    {
        int n = epoll_wait(g_epfd, evs, 32, -1);
        if (n < 0)
        {
            if (errno == EINTR)
                continue;
            return;
        }
        for (int i = 0; i < n; i++)
        {
            uint32_t node = evs[i].data.u32;
            if (node == STOP_KEY)
                return;
            for (int k = 0; k < READ_BURST; k++)
            {
                ssize_t r = ::read(g_tap_fd[node], buf.data(), buf.size());
                if (r < 0 && (errno == EAGAIN || errno == EINTR))
                    break; // level-triggered: epoll reports what is left again
                if (r <= 0)
                {
                    // The tap is gone (its namespace was deleted): stop watching it.
                    epoll_ctl(g_epfd, EPOLL_CTL_DEL, g_tap_fd[node], nullptr);
                    break;
                }
                uint8_t* copy = static_cast<uint8_t*>(std::malloc(size_t(r)));
                if (copy == nullptr)
                    break;
                std::memcpy(copy, buf.data(), size_t(r));
                Simulator::ScheduleWithContext(g_tap_ctx[node],
                                               Seconds(0),
                                               MakeEvent(&FromTap, node, copy, uint32_t(r)));
            }
        }
    }
}

// `fd`: an open, non-blocking tap (IFF_TAP | IFF_NO_PI) for node `node`.
void
AttachTap(uint32_t node, int fd, Ptr<WifiNetDevice> dev)
{
    if (g_tap_fd.size() <= node)
    {
        g_tap_fd.resize(node + 1, -1);
        g_tap_dev.resize(node + 1);
        g_tap_ctx.resize(node + 1, 0);
    }
    g_tap_fd[node] = fd;
    g_tap_dev[node] = dev;
    g_tap_ctx[node] = dev->GetNode()->GetId();
    dev->SetReceiveCallback(MakeCallback(&DiscardRx));
    dev->SetPromiscReceiveCallback(MakeBoundCallback(&DeviceRx, node));
}

// Starts the reader and writer threads; returns an error text, empty on success.
std::string
StartTapIo()
{
    g_tap = TapCounters{};
    g_tap_written = g_tap_write_errors = 0;
    g_wstop = false;
    g_epfd = epoll_create1(EPOLL_CLOEXEC);
    g_stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g_epfd < 0 || g_stopfd < 0)
        return std::string("epoll/eventfd: ") + std::strerror(errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = STOP_KEY;
    if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, g_stopfd, &ev) != 0)
        return std::string("epoll_ctl: ") + std::strerror(errno);
    for (uint32_t i = 0; i < g_tap_fd.size(); i++)
    {
        if (g_tap_fd[i] < 0)
            continue;
        ev.data.u32 = i;
        if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, g_tap_fd[i], &ev) != 0)
            return std::string("epoll_ctl tap: ") + std::strerror(errno);
    }
    g_writer = std::thread(WriterLoop);
    g_reader = std::thread(ReaderLoop);
    return "";
}

// Stops both threads after the writer has written what it holds.
void
StopTapIo()
{
    if (g_reader.joinable())
    {
        uint64_t one = 1;
        ssize_t w = ::write(g_stopfd, &one, sizeof(one)); // wakes the reader's epoll_wait
        (void)w;
        g_reader.join();
    }
    if (g_writer.joinable())
    {
        {
            std::lock_guard<std::mutex> lk(g_wmu);
            g_wstop = true;
        }
        g_wcv.notify_one();
        g_writer.join();
    }
    if (g_epfd >= 0)
        ::close(g_epfd);
    if (g_stopfd >= 0)
        ::close(g_stopfd);
    g_epfd = g_stopfd = -1;
}

// from_tap, to_tap, other_host, bad_frames, write_errors, queue_drops (after StopTapIo).
std::vector<uint64_t>
TapCountersAll()
{
    return {g_tap.from_tap, g_tap_written, g_tap.other_host,
            g_tap.bad_frames, g_tap_write_errors, g_tap.queue_drops};
}

// ---- lag probe -------------------------------------------------------------
// Every probe records how far simulated time is behind real time, and the real time
// and the CPU time of this thread (the event loop's) at that moment: whether a loop
// that fell behind was busy (it needed more than a core) or waited for the CPU.
static std::vector<double> g_lag_ms;
static std::vector<double> g_real_s;
static std::vector<double> g_cpu_s;
static bool g_lag_on{false};
static Time g_probe_period = MilliSeconds(5);

static double
ThreadCpuSeconds()
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return -1.0;
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

static void
Probe()
{
    if (g_lag_on)
    {
        Ptr<RealtimeSimulatorImpl> rt =
            DynamicCast<RealtimeSimulatorImpl>(Simulator::GetImplementation());
        if (rt)
        {
            Time real = rt->RealtimeNow();
            g_lag_ms.push_back((real - Simulator::Now()).GetSeconds() * 1e3);
            g_real_s.push_back(real.GetSeconds());
            g_cpu_s.push_back(ThreadCpuSeconds());
        }
    }
    Simulator::Schedule(g_probe_period, &Probe);
}

std::vector<double>
LagSamples()
{
    return g_lag_ms;
}

std::vector<double>
ProbeRealSeconds()
{
    return g_real_s;
}

std::vector<double>
ProbeCpuSeconds()
{
    return g_cpu_s;
}

// ---- control channel: line commands on a file descriptor --------------------
// "mark" (start lag recording), "stop", "down N", "up N", "link A B DB PER".
static int g_ctl_fd{-1};
static std::string g_ctl_buf;
static std::vector<std::string> g_log;
static Time g_poll_period = MilliSeconds(10);

static void
Exec(const std::string& line)
{
    std::istringstream is(line);
    std::string cmd;
    is >> cmd;
    std::ostringstream rec;
    rec << Simulator::Now().GetSeconds() << " " << line;
    g_log.push_back(rec.str());
    if (cmd == "stop")
    {
        g_lag_on = false;
        Simulator::Stop();
    }
    else if (cmd == "mark")
    {
        g_lag_ms.clear();
        g_real_s.clear();
        g_cpu_s.clear();
        g_lag_on = true;
    }
    else if (cmd == "down" || cmd == "up")
    {
        uint32_t n = 0;
        if (is >> n && n < g_down.size())
            SetNodeDown(n, cmd == "down");
    }
    else if (cmd == "link")
    {
        uint32_t a = 0, b = 0;
        double db = 0, per = 0;
        if (is >> a >> b >> db >> per && a < g_db.size() && b < g_db.size())
            SetLink(a, b, db, per);
    }
}

static void
Poll()
{
    char buf[4096];
    while (true)
    {
        ssize_t r = ::read(g_ctl_fd, buf, sizeof(buf));
        if (r > 0)
        {
            g_ctl_buf.append(buf, size_t(r));
            continue;
        }
        if (r == 0)
        {
            // The orchestrator went away: end the medium.
            g_log.push_back("eof");
            Simulator::Stop();
            return;
        }
        break; // EAGAIN
    }
    size_t pos;
    while ((pos = g_ctl_buf.find('\n')) != std::string::npos)
    {
        std::string line = g_ctl_buf.substr(0, pos);
        g_ctl_buf.erase(0, pos + 1);
        if (!line.empty())
            Exec(line);
    }
    Simulator::Schedule(g_poll_period, &Poll);
}

void
StartControl(int fd)
{
    g_ctl_fd = fd;
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    Simulator::Schedule(g_poll_period, &Poll);
    Simulator::Schedule(g_probe_period, &Probe);
}

std::vector<std::string>
ControlLog()
{
    return g_log;
}

std::vector<uint64_t>
CountersOf(uint32_t n)
{
    Counters c = g_counters[n];
    if (n < g_phy.size() && g_phy[n])
    {
        // the state the PHY is in now has not been reported yet
        auto now = static_cast<uint64_t>(Simulator::Now().GetMicroSeconds());
        if (now > c.state_logged_until_us)
            AddStateTime(c, g_phy[n]->GetState()->GetState(), now - c.state_logged_until_us);
    }
    // the queue state held since the last count has not been credited yet
    AddQueueTime(c, static_cast<uint64_t>(Simulator::Now().GetMicroSeconds()));
    std::vector<uint64_t> v{c.mac_tx, c.mac_rx, c.phy_tx, c.phy_rx_ok, c.phy_rx_drop,
                            c.phy_rx_collision, c.imposed_loss, c.retries, c.final_failures,
                            c.rts_failed};
    for (int i = 0; i < 8; i++)
        v.push_back(c.tid_count[i]);
    v.push_back(c.queue_full);
    v.push_back(c.queue_expired);
    for (uint64_t x : {c.air_large_us, c.air_small_us, c.air_mac_us, c.air_retry_us, c.state_idle_us,
                       c.state_cca_us, c.state_tx_us, c.state_rx_us, c.queued_us, c.queued_data_us})
        v.push_back(x);
    return v;
}
} // namespace hoplab
