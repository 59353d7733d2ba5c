// Helpers for the lab's ns-3 medium process, compiled at run time through cppyy.
// Everything that runs per frame or per timer lives here so the Python
// interpreter is never entered from the simulator's event loop.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
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
};

static std::vector<Counters> g_counters;
static std::vector<std::vector<double>> g_per; // g_per[tx][rx] frame loss probability
static std::vector<uint8_t> g_down;            // node muted and deaf
static Ptr<MatrixPropagationLossModel> g_matrix;
static std::vector<Ptr<MobilityModel>> g_mob;
static std::vector<std::vector<double>> g_db; // configured path loss per directed pair
static bool g_classify{true};

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

static void
ApplyDb(uint32_t a, uint32_t b)
{
    double db = (g_down[a] || g_down[b]) ? 1000.0 : g_db[a][b];
    g_matrix->SetLoss(g_mob[a], g_mob[b], db, false);
}

void
Setup(uint32_t n, Ptr<MatrixPropagationLossModel> m, bool classify)
{
    g_counters.assign(n, Counters{});
    g_per.assign(n, std::vector<double>(n, 0.0));
    g_db.assign(n, std::vector<double>(n, 1000.0));
    g_down.assign(n, 0);
    g_mob.assign(n, nullptr);
    g_matrix = m;
    g_classify = classify;
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
    Ptr<WifiPhy> phy = dev->GetPhy();
    phy->TraceConnectWithoutContext("PhyTxBegin", MakeBoundCallback(&OnPhyTx, node));
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
}

void
SetTxop(Ptr<WifiNetDevice> dev, uint8_t ac, double us)
{
    Ptr<QosTxop> q = dev->GetMac()->GetQosTxop(AcIndex(ac));
    if (q)
        q->SetTxopLimit(MicroSeconds(int64_t(us)));
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
    const Counters& c = g_counters[n];
    std::vector<uint64_t> v{c.mac_tx, c.mac_rx, c.phy_tx, c.phy_rx_ok, c.phy_rx_drop,
                            c.phy_rx_collision, c.imposed_loss, c.retries, c.final_failures,
                            c.rts_failed};
    for (int i = 0; i < 8; i++)
        v.push_back(c.tid_count[i]);
    return v;
}
} // namespace hoplab
