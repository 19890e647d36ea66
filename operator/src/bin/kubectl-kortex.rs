//! `kubectl-kortex`: the kubectl plugin for ActionProposals (`kubectl kortex list|approve|reject|undo`).

fn main() -> std::process::ExitCode {
    kortex::kubectl_plugin::main()
}
