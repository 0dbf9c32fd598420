# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_vramgate_global_optspecs
    string join \n config= h/help V/version
end

function __fish_vramgate_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_vramgate_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_vramgate_using_subcommand
    set -l cmd (__fish_vramgate_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c vramgate -n "__fish_vramgate_needs_command" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c vramgate -n "__fish_vramgate_needs_command" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "status" -d 'Show each GPU\'s memory, its reservations and its queue'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "doctor" -d 'Check the config, the GPU driver (NVML), the state directory, the hook binary and which container engines are set up to run the hook; changes nothing'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "release" -d 'Release a container\'s reservation (and queue ticket) by name or container id'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "gc" -d 'Reclaim reservations and tickets whose processes are gone'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "metrics" -d 'Print Prometheus metrics (GPU memory, reservations, queue, outcome counters), or write them for node_exporter\'s textfile collector'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "exporter" -d 'Serve Prometheus metrics over HTTP at /metrics (what `vramgate metrics` prints, taken at each scrape)'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "watch" -d 'Watch what each reserved container holds on its GPUs and act on one over its reservation, as [enforce] over_use says: report (an over_use event) or kill (stop the container). Runs until stopped; the package\'s vramgate-watch.service runs it'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "ledger" -d 'Inspect or repair the ledger'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "setup" -d 'Wire vramgate into an engine: docker, containerd, podman or crio'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "setup-node" -d 'Set up the node this runs on from a privileged container with the host\'s root mounted (the Helm chart\'s node set-up DaemonSet): copy vramgate-hook and vramgate-runtime into the host\'s /usr/local/lib/vramgate, run `setup containerd` on the host\'s config, restart containerd once; then wait, and on SIGTERM or SIGINT put every file back byte-for-byte, remove the binaries and restart containerd again. A run that finds what a killed one left undoes it first'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "replay" -d 'Replay a workload (a host\'s events.jsonl, or a job file) on vramgate\'s own decision code, on simulated GPUs and a virtual clock: what other GPUs, a strategy, backfill, a policy, headroom or exclusive GPUs (one job per GPU) would have done. Settings not given are the config\'s'
complete -c vramgate -n "__fish_vramgate_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -s n -l interval -d 'Seconds between redraws, as watch(1) (0.1 to 86400; implies --watch)' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -l record -d 'Also write what the inventory answered (GPUs, processes, their pid namespaces) and the ledger to this file, for test fixtures' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -l note -d 'A note stored in the recording (what was running)' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -l json -d 'Print JSON for scripts instead of a table'
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -s w -l watch -d 'Redraw every 2 seconds (or every -n) until Ctrl-C: in place on a terminal, one table after another when piped'
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand status" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand doctor" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand doctor" -l json -d 'Print JSON for scripts instead of lines'
complete -c vramgate -n "__fish_vramgate_using_subcommand doctor" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand release" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand release" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand release" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand gc" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand gc" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand gc" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand metrics" -l textfile-dir -d 'Write DIR/vramgate.prom atomically instead of printing, for node_exporter\'s --collector.textfile.directory (run it from a timer)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand metrics" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand metrics" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand metrics" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand exporter" -l listen -d 'The address and port to listen on; metrics name containers, so keep it on loopback or a network only Prometheus reaches' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand exporter" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand exporter" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand exporter" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand watch" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand watch" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand watch" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -f -a "show" -d 'Print the raw ledger JSON'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -f -a "repair" -d 'Set an unreadable ledger aside (renamed, never deleted) and start an empty one'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and not __fish_seen_subcommand_from show repair help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from show" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from show" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from show" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from repair" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from repair" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from repair" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from help" -f -a "show" -d 'Print the raw ledger JSON'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from help" -f -a "repair" -d 'Set an unreadable ledger aside (renamed, never deleted) and start an empty one'
complete -c vramgate -n "__fish_vramgate_using_subcommand ledger; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l config-path -d 'The file to edit (docker: daemon.json; containerd: the drop-in) or directory (podman, crio: hooks.d) instead of the engine\'s default' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l containerd-config -d 'containerd\'s main config, which must import the drop-in' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l crio-drop-in -d 'CRI-O\'s drop-in with the runtime handler vramgate (crio)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l runtime-path -d 'The vramgate-runtime binary the engine runs (default: next to this binary, else /usr/bin)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l hook-path -d 'The vramgate-hook binary hooks.d points at (default: next to this binary, else /usr/bin)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l dry-run -d 'Print what would change, and the new content, without writing anything'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l remove -d 'Undo what setup did'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -l set-as-default -d 'Make vramgate the engine\'s default runtime (docker, containerd)'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l host-root -d 'Where the host\'s root file system is mounted' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l engine -d 'The engine to set up (containerd only, for now)' -r -f -a "containerd\t''"
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l engine-config -d 'The engine\'s main config, as a path on the host' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l engine-socket -d 'The engine\'s socket, as a path on the host: its server is the process signalled' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l engine-tasks -d 'containerd\'s task directory (its --state, then io.containerd.runtime.v2.task), as a path on the host: the undo keeps the binaries while a container there still runs through them' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l restart -d 'How the engine is restarted: signal (SIGHUP to the process serving its socket, which ends containerd, and its service manager starts it again; needs the host\'s PID namespace) or none (the admin restarts it)' -r -f -a "signal\t'SIGHUP to the process that serves the engine\'s socket (found with SO_PEERCRED; the container needs the host\'s PID namespace). containerd does not handle SIGHUP, so it exits and its service manager starts it again (systemd\'s containerd.service has `Restart=always`); running containers keep running. NVIDIA\'s toolkit does the same'
none\t'Nothing: the admin restarts the engine'"
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l install-dir -d 'The host directory the binaries are copied to (vramgate\'s own: it is removed on undo)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l engine-root -d 'Where the engine sees the host\'s root (/ unless the engine itself runs in a chroot, as a test\'s may)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l install-config -d 'A config.toml in this container (the chart\'s ConfigMap) to install on the host at --host-config, given back as it was on undo; this set-up then reads it too' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l host-config -d 'Where the host\'s hook and runtime read config.toml, as a path on the host' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l wait -d 'Seconds to wait for another run\'s lock, for the engine to come back, and, on undo, for the containers still running through the copied wrapper to stop' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -l set-as-default -d 'Make vramgate containerd\'s default runtime'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c vramgate -n "__fish_vramgate_using_subcommand setup-node" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l gpus -d 'The GPUs to replay on, COUNTxSIZE[,COUNTxSIZE...] (default: the config\'s [[inventory.gpus]]; an event log does not record GPU sizes)' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l strategy -d 'Placement strategy: best-fit or spread' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l backfill -d 'Let requests that fit pass older waiters: true or false' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l backfill-bound -d '...but never one that has waited longer than this ("30s")' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l backfill-order -d 'Which waiter that fits goes first: arrival, largest (memory) or longest (the job\'s expected_duration, then memory)' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l policy -d 'Policy for jobs that do not set one: wait or reject' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l headroom -d 'Memory kept free on every GPU ("2Gi", "5%")' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l sharing -d 'How jobs hold GPUs: shared (vramgate: jobs that fit share a GPU) or exclusive (the baseline without it: one job per whole GPU, as `nvidia.com/gpu: 1` hands them out)' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l declared -d 'What jobs declare as their expected duration: given (the job file\'s expected_duration; an event log has none) or exact (each job its real duration), for backfill-order longest' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l compare -d 'Replay once per value and show them side by side: KEY=V1,V2 with KEY one of gpus, strategy, backfill, backfill-bound, backfill-order, policy, headroom, sharing, declared (gpus values are separated by \'|\'); sharing=exclusive,shared also says how much shorter the shared makespan is' -r
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l timeline -d 'Write the timeline (reserved bytes per GPU and queue length at each event) as CSV' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l plot -d 'Write a plot of the first setting\'s timeline as SVG' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l config -d 'Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)' -r -F
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -l json -d 'Print JSON for scripts instead of a table'
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -s h -l help -d 'Print help'
complete -c vramgate -n "__fish_vramgate_using_subcommand replay" -s V -l version -d 'Print version'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "status" -d 'Show each GPU\'s memory, its reservations and its queue'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "doctor" -d 'Check the config, the GPU driver (NVML), the state directory, the hook binary and which container engines are set up to run the hook; changes nothing'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "release" -d 'Release a container\'s reservation (and queue ticket) by name or container id'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "gc" -d 'Reclaim reservations and tickets whose processes are gone'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "metrics" -d 'Print Prometheus metrics (GPU memory, reservations, queue, outcome counters), or write them for node_exporter\'s textfile collector'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "exporter" -d 'Serve Prometheus metrics over HTTP at /metrics (what `vramgate metrics` prints, taken at each scrape)'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "watch" -d 'Watch what each reserved container holds on its GPUs and act on one over its reservation, as [enforce] over_use says: report (an over_use event) or kill (stop the container). Runs until stopped; the package\'s vramgate-watch.service runs it'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "ledger" -d 'Inspect or repair the ledger'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "setup" -d 'Wire vramgate into an engine: docker, containerd, podman or crio'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "setup-node" -d 'Set up the node this runs on from a privileged container with the host\'s root mounted (the Helm chart\'s node set-up DaemonSet): copy vramgate-hook and vramgate-runtime into the host\'s /usr/local/lib/vramgate, run `setup containerd` on the host\'s config, restart containerd once; then wait, and on SIGTERM or SIGINT put every file back byte-for-byte, remove the binaries and restart containerd again. A run that finds what a killed one left undoes it first'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "replay" -d 'Replay a workload (a host\'s events.jsonl, or a job file) on vramgate\'s own decision code, on simulated GPUs and a virtual clock: what other GPUs, a strategy, backfill, a policy, headroom or exclusive GPUs (one job per GPU) would have done. Settings not given are the config\'s'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and not __fish_seen_subcommand_from status doctor release gc metrics exporter watch ledger setup setup-node replay help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and __fish_seen_subcommand_from ledger" -f -a "show" -d 'Print the raw ledger JSON'
complete -c vramgate -n "__fish_vramgate_using_subcommand help; and __fish_seen_subcommand_from ledger" -f -a "repair" -d 'Set an unreadable ledger aside (renamed, never deleted) and start an empty one'
