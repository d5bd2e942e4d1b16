// Evaluate recorded AWS API calls against IAM policies with @cloud-copilot/iam-simulate
// (scripts/iam_proof.py writes the requests and reads the answers).
//
// stdin:  {"requests": [{"id", "principal", "action", "resource", "accountId", "context",
//                        "policies": [{"name", "policy"}]}]}
// stdout: {"results": [{"id", "decision", "allowedBy": [[policyName, sid], ...], "errors"}]}
import { runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const { requests } = JSON.parse(Buffer.concat(chunks).toString('utf8'))

const results = []
for (const request of requests) {
  const simulation = {
    identityPolicies: request.policies,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    request: {
      action: request.action,
      principal: request.principal,
      resource: { resource: request.resource, accountId: request.accountId },
      contextVariables: request.context
    }
  }
  const answer = await runSimulation(simulation, {})
  if (answer.errors) {
    results.push({ id: request.id, decision: 'Error', allowedBy: [], errors: answer.errors })
    continue
  }
  const analysis = answer.result.analysis
  // A statement is an object of the policy library: its JSON form carries the Sid.
  const allowedBy = (analysis.identityAnalysis?.allowStatements ?? []).map((s) => [s.policyId, JSON.parse(JSON.stringify(s.statement)).Sid ?? ''])
  results.push({ id: request.id, decision: analysis.result, allowedBy, ignoredContextKeys: answer.result.ignoredContextKeys ?? [] })
}
process.stdout.write(JSON.stringify({ results }))
